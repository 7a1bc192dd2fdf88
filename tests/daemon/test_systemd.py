"""The shipped systemd unit and example config are valid."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peerd.settings.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_the_example_config_is_valid():
    config = load_config(REPO / "systemd" / "peerd.toml")
    assert config.state_dir == Path("/var/lib/peerd")
    assert config.control_socket == Path("/run/peerd/control.sock")
    # One file for every machine: the address is picked at start, and mDNS follows it.
    assert (config.host, config.interfaces) == ("auto", ("auto",))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    peerd = Path(sys.executable).with_name("peerd")
    unit = (REPO / "systemd" / "peerd.service").read_text().replace("/opt/peerd/.venv/bin/peerd", str(peerd))
    path = tmp_path / "peerd.service"
    path.write_text(unit)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    # Only complaints about this unit count (the host's own units may have warnings).
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "peerd.service" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr
    assert "Type=notify" in unit and "WatchdogSec=" in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_per_gpu_template_unit_passes_verify(tmp_path):
    peerd = Path(sys.executable).with_name("peerd")
    unit = (REPO / "systemd" / "peerd@.service").read_text().replace("/opt/peerd/.venv/bin/peerd", str(peerd))
    assert "--config /etc/peerd/peerd-%i.toml" in unit and "StateDirectory=peerd/%i" in unit
    (tmp_path / "peerd@.service").write_text(unit)
    instance = tmp_path / "peerd@1.service"
    instance.symlink_to(tmp_path / "peerd@.service")
    out = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "peerd@" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def test_a_per_gpu_config_pins_its_device(tmp_path):
    text = (REPO / "systemd" / "peerd.toml").read_text().replace('device = "auto"', 'device = "cuda:1"')
    text = text.replace("/var/lib/peerd", "/var/lib/peerd/1").replace("/run/peerd/control.sock", "/run/peerd/1/control.sock")
    (tmp_path / "peerd-1.toml").write_text(text)
    config = load_config(tmp_path / "peerd-1.toml")
    assert config.worker_devices == ("cuda:1",)
    assert config.control_socket == Path("/run/peerd/1/control.sock")
