"""peerd.lightning stays the script's: the daemon and the worker never import
it (nor Lightning), and without Lightning it says what to install."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
{before}
{imports}
print(sorted(m for m in sys.modules if m == "peerd.lightning" or m.split(".")[0] in ("lightning", "pytorch_lightning")))
"""


def run(imports: str, before: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK.format(before=before, imports=imports)],
                          capture_output=True, text=True, timeout=120)


def test_the_daemon_and_the_worker_never_import_lightning():
    done = run("import peerd.cli.daemon, peerd.cli.peerctl, peerd.daemon.app, peerd.worker.main, peerd.peer")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_lightning_the_import_names_the_extra_to_install():
    # A None entry in sys.modules is how Python marks a package that cannot be imported.
    done = run("import peerd.lightning", before="sys.modules['lightning'] = None")
    assert done.returncode != 0
    assert "ImportError: peerd.lightning needs PyTorch Lightning (lightning>=2.4,<3): pip install peerd[lightning]" \
        in done.stderr, done.stderr
