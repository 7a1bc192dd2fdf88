"""Helpers shared by end-to-end test modules: comparing saved models, a job
script run alone beside the daemons, and the job whose code travels to a
daemon that joins it by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from conftest import wait_for
from peerd.security.auth import new_secret_file


def flat_params(state_dict: dict) -> torch.Tensor:
    return torch.cat([v.reshape(-1).float() for v in state_dict.values()])


def rel_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / ((a.norm() + b.norm()) / 2))


JOBCODE = Path(__file__).parents[1] / "jobcode"


def script_job(name: str, script: str, args: list[str], epochs: int, min_peers: int, **job: object) -> str:
    """A script job from tests/jobcode: the script's LR exactly (no LR law, the
    default), a round after every step, no evaluation by peerd on the way;
    `job` adds [job] keys (metric, chance, local_batch, ...)."""
    keys = "".join(f"{k} = {json.dumps(v)}\n" for k, v in job.items())
    return (f'[job]\nname = "{name}"\nscript = "{script}"\nargs = {json.dumps(args)}\nepochs = {epochs}\n'
            f'min_peers = {min_peers}\neval_every_rounds = 1000\n{keys}[gossip]\nperiod_steps = 1\n')


class Alone:
    """A job script as a plain script: one process, no peerd, started with
    `args` (default: --alone OUT) in `out`, where it writes summary.json."""

    def __init__(self, script: str, out: Path, args: tuple[str, ...] | None = None) -> None:
        out.mkdir()
        self.out = out
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one process among the daemons' workers on few cores
        args = ("--alone", str(out)) if args is None else args
        self.proc = subprocess.Popen([sys.executable, str(JOBCODE / script), *args], cwd=out, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def summary(self) -> dict:
        # Bounded generously: it trains beside the daemons' workers on a shared
        # machine, and a loaded one was seen to need over 120 s past the peers' end.
        output, _ = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, output
        return json.loads((self.out / "summary.json").read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def join_held(cluster, peer, name: str) -> Path:
    """`peer` joins the running job `name` with a `hold` file in its worker's
    directory: the script (one of tests/jobcode's that honour `hold`) makes its
    Trainer, then waits before training (and so before it joins) until
    release(). Its directory."""
    wait_for(lambda: any(j.name == name for j in cluster.client(peer).jobs().jobs), 30,
             f"{peer.peer_id} to hear of {name}")
    held = peer.dir / "state" / "jobs" / name
    held.mkdir(parents=True)
    (held / "hold").touch()
    cluster.client(peer).join_by_name(name, str(JOBCODE))
    return held


def release(held: Path) -> None:
    """The held worker joins now, its seconds of imports behind it."""
    wait_for(lambda: (held / "holding").exists(), 60, f"the script in {held} to be ready to train")
    (held / "hold").unlink()


def trained_with_a_late_join(cluster, name: str, text: str, other: str, at_epoch: float) -> dict:
    """peer-0 and peer-1 start the job `name` (job file `text`) together; peer-2's
    worker, started with them, holds before training (the script's `hold` file)
    until they are `at_epoch` into the job, then joins the running job; a job of
    other epochs on peer-0 beside it (`other`, named "other-epochs"). Every
    (peer, job)'s status once the three finished and the other failed."""
    from conftest import all_finished, wait_for_discovery

    first, second, late = cluster.peers
    wait_for_discovery(cluster)
    for peer in (first, second):
        cluster.client(peer).join(text, str(JOBCODE))
    cluster.client(first).join(other, str(JOBCODE))

    def statuses():
        return {(p.peer_id, j.name): j for p in cluster.peers for j in cluster.client(p).status().jobs}

    held = join_held(cluster, late, name)
    wait_for(lambda: (j := statuses().get(("peer-0", name))) and j.progress.epoch >= at_epoch, 120,
             f"the first two to train {at_epoch} epoch(s)")
    release(held)

    def settled():
        jobs = statuses()
        wrong = jobs.get(("peer-0", "other-epochs"))
        done = all_finished(j for (_, n), j in jobs.items() if n == name)
        return done and len(done) == 3 and wrong is not None and wrong.state == "failed" and jobs

    return wait_for(settled, 300, "the job to finish on the three peers and the other epochs to fail")


JOB_MODULE = '''
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

# The settings travel with the code ([job] files): without them the job cannot load.
SETTINGS = json.loads((Path(__file__).parents[1] / "settings.json").read_text())
print(f"codejob loaded from {__file__}", flush=True)


def make_model():
    return nn.Linear(4, 1)


def make_datasets(ctx):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SETTINGS["samples"], 4, generator=gen)
    y = x @ torch.tensor(SETTINGS["weights"])
    return TensorDataset(x, y), TensorDataset(x[:64], y[:64])


def loss(model, batch):
    x, y = batch
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).mean()


def evaluate(model, batches):
    total = seen = 0.0
    for x, y in batches:
        total += float(0.5 * ((model(x).squeeze(1) - y) ** 2).sum())
        seen += len(y)
    return {"loss": total / seen}
'''

JOB = textwrap.dedent('''
    [job]
    name = "travel"
    module = "codejob"
    files = ["settings.json"]
    secret_file = "job.secret"
    metric = "loss"
    local_batch = 8
    epochs = 12
    min_peers = 2
    eval_every_rounds = 50
    [optimizer]
    lr = 0.05
    momentum = 0.0
    schedule = "constant"
''')


def peerctl(peer, *args: str, answer: str = "") -> subprocess.CompletedProcess:
    """conftest's peerctl with `answer` on its stdin (the confirmation prompt) and
    the time a join takes to fetch the job's code."""
    return subprocess.run([sys.executable, "-m", "peerd.cli.peerctl", "--socket", str(peer.socket), *args],
                          input=answer, capture_output=True, text=True, timeout=330)


def secret_dir(path, secret=None):
    """A directory of the operator's that holds the job secret (a copy, or a new one) and no code."""
    path.mkdir()
    if secret is None:
        new_secret_file(path / "job.secret")
    else:
        shutil.copy(secret, path / "job.secret")
    return path
