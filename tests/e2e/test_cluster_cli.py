"""`peerd cluster`: the README's first command runs a local cluster to the end,
any local-data job with one data root per peer, the workers start together
([job] min_peers), and the headline is the saved model's metric."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from conftest import example_job
from peerd.cli.cluster import _num
from peerd.cli.daemon import main as peerd_main

CLUSTER_TIMEOUT_S = 400

# A least-squares job whose samples are only in each peer's data root: a peer reads
# <root>/samples.json, and refuses a root that is not its own (root/owner), so a
# finished run proves every peer got its own root.
LSQ_JOB = textwrap.dedent('''\
    """Least squares on each peer's own samples (data_mode = "local")."""
    import json
    from pathlib import Path

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset


    def make_model():
        model = nn.Linear(3, 1, bias=False)
        nn.init.zeros_(model.weight)
        return model


    def make_datasets(ctx):
        root = Path(ctx.data_root)
        owner = (root / "owner").read_text().strip()
        if owner != ctx.peer_id:
            raise ValueError(f"{ctx.peer_id} was given {owner}'s data root {root}")
        data = json.loads((root / "samples.json").read_text())
        x, y = torch.tensor(data["x"]), torch.tensor(data["y"])
        return TensorDataset(x[:-40], y[:-40]), TensorDataset(x[-40:], y[-40:])


    def loss(model, batch):
        x, y = batch
        return ((model(x).squeeze(1) - y) ** 2).mean()


    def evaluate(model, batches):
        total = seen = 0.0
        for x, y in batches:
            total += float(((model(x).squeeze(1) - y) ** 2).sum())
            seen += len(y)
        return {"mse": total / seen}
    ''')


def lsq_job(tmp: Path, **job) -> Path:
    """The job module and its job file in `tmp`; returns the job file."""
    (tmp / "lsq_job.py").write_text(LSQ_JOB)
    extra = "".join(f"{k} = {v!r}\n" for k, v in job.items())
    path = tmp / "lsq.toml"
    path.write_text('[job]\nname = "lsq"\nmodule = "lsq_job"\ndata_mode = "local"\n'
                    'metric = "mse"\nmetric_mode = "min"\n'
                    f'local_batch = 32\nepochs = 10\neval_every_rounds = 50\n{extra}'
                    '[optimizer]\nlr = 0.05\nmomentum = 0.0\nschedule = "constant"\n')
    return path


def write_root(root: Path, owner: str, n: int, seed: int) -> None:
    """n samples of y = x·w + noise, w the same on every peer, x drawn per peer."""
    import random

    rng = random.Random(seed)
    w = (1.0, -2.0, 0.5)
    x = [[rng.gauss(0, 1) + seed for _ in w] for _ in range(n)]
    y = [sum(a * b for a, b in zip(row, w)) + rng.gauss(0, 0.01) for row in x]
    root.mkdir(parents=True)
    (root / "owner").write_text(owner)
    (root / "samples.json").write_text(json.dumps({"x": x, "y": y}))


def run_cluster(*args: str) -> subprocess.CompletedProcess:
    """`peerd cluster ARGS` as a user runs it. On a timeout it is stopped with
    SIGTERM, which stops every daemon it started (then killed, as a last resort)."""
    env = {**os.environ, "COLUMNS": "400"}  # one line per message: no wrapping to match across
    proc = subprocess.Popen([sys.executable, "-m", "peerd.cli.daemon", "cluster", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=CLUSTER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"peerd cluster ran past {CLUSTER_TIMEOUT_S}s:\n{stdout[-3000:]}{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def handed_job(run: Path, peer: int, name: str) -> dict:
    """The job file a daemon of the cluster was given."""
    return tomllib.loads((run / f"peer-{peer}" / "state" / "jobs" / name / "job.toml").read_text())


@pytest.mark.e2e
def test_peerd_cluster_trains_to_the_end_and_reports_the_saved_models_accuracy(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(example_job(job={"name": "readme", "epochs": 2, "eval_every_rounds": 20}))
    out = run_cluster("--peers", "2", "--job", str(job), "--out", str(tmp_path / "run"), "--slowdowns", "1,1.5")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    saved = [json.loads((tmp_path / "run" / f"peer-{k}" / "state" / "jobs" / "readme" / "model.json").read_text())
             for k in range(2)]
    assert saved[0]["consensus_digest"] == saved[1]["consensus_digest"]
    value = f"{saved[0]['metrics']['consensus_accuracy']:.4f}"
    assert (f"test accuracy of the saved model: {value} (higher is better; model.pt, the consensus of 2 peers, "
            "the same on every peer); each peer's own model: peer-0 ") in out.stdout
    assert all(handed_job(tmp_path / "run", k, "readme")["job"]["min_peers"] == 2 for k in range(2))
    port = tomllib.loads((tmp_path / "run" / "peer-0" / "peerd.toml").read_text())["metrics"]["port"]
    assert f"live page: http://127.0.0.1:{port}/ (peer-0's daemon" in out.stdout
    assert (tmp_path / "run" / "progress.png").stat().st_size > 0
    assert (tmp_path / "run" / "history.csv").read_text().count("\n") > 2
    # Each worker's curves, one run per peer in OUT/tensorboard/JOB/MEMBER, read by TensorBoard's own reader.
    tensorboard = (tmp_path / "run" / "tensorboard").resolve()
    assert f"TensorBoard: tensorboard --logdir {tensorboard}" in out.stdout
    assert sorted(p.name for p in (tensorboard / "readme").iterdir()) == ["peer-0", "peer-1"]
    for k in range(2):
        curves = tensorboard_scalars(tensorboard / "readme" / f"peer-{k}")
        assert {"train/loss", "train/lr", "train/samples_per_s", "train/local_batch", "train/global_batch",
                "time/round_s", "time/exchange_s", "gossip/disagreement", "eval/accuracy",
                "consensus/accuracy"} <= set(curves)
        rounds = [step for step, _ in curves["train/loss"]]
        assert len(rounds) > 3 and rounds == sorted(set(rounds))
        assert curves["train/global_batch"][-1][1] == 64  # 2 peers × local_batch 32
        # every 20 rounds and once at the end, never repeated in the rounds between
        evaluated = [step for step, _ in curves["eval/accuracy"]]
        assert len(evaluated) < len(rounds) and all(s % 20 == 0 for s in evaluated[:-1])
        (end, value), = curves["consensus/accuracy"]  # the saved model's, once, at the last round
        assert end == evaluated[-1] >= rounds[-1]
        assert value == pytest.approx(saved[k]["metrics"]["consensus_accuracy"])


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.e2e
def test_peerd_cluster_with_two_workers_per_daemon(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(example_job(job={"name": "pair", "epochs": 2, "eval_every_rounds": 20}))
    out = run_cluster("--peers", "1", "--workers", "2", "--job", str(job), "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "peer-0.0: finished" in out.stdout and "peer-0.1: finished" in out.stdout
    assert "the consensus of 2 peers, the same on every peer" in out.stdout
    assert handed_job(tmp_path / "run", 0, "pair")["job"]["min_peers"] == 2  # 1 daemon × 2 workers


@pytest.mark.e2e
def test_peerd_cluster_runs_a_local_data_job_with_each_peers_own_data_root(tmp_path):
    """A job of the user's own, data_mode = "local", each peer's samples in its own
    folder of --data-dir; --peers comes from the folders. The headline is a loss:
    lower is better, and each peer's test data is its own."""
    job = lsq_job(tmp_path)
    for k in range(2):
        write_root(tmp_path / "data" / f"peer-{k}", f"peer-{k}", n=1500 + 500 * k, seed=k)
    (tmp_path / "data" / "notes").mkdir()  # anything else in the directory is not a peer's
    run = tmp_path / "run"
    out = run_cluster("--job", str(job), "--data-dir", str(tmp_path / "data"), "--out", str(run))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"local data: peer-0: {tmp_path / 'data' / 'peer-0'}; peer-1: {tmp_path / 'data' / 'peer-1'}; " \
           f"a job secret in {run / 'job.secret'}" in out.stdout
    for k in range(2):
        assert tomllib.loads((run / f"peer-{k}" / "peerd.toml").read_text())["data"]["root"] == \
            str(tmp_path / "data" / f"peer-{k}")
        assert handed_job(run, k, "lsq")["job"]["min_peers"] == 2
    saved = [json.loads((run / f"peer-{k}" / "state" / "jobs" / "lsq" / "model.json").read_text()) for k in range(2)]
    assert all(s["metrics"]["consensus_mse"] < 0.05 for s in saved)  # the model fits the peer's data
    own = "each peer's own model: " + ", ".join(f"peer-{k} {_num(s['metrics']['mse'])}" for k, s in enumerate(saved))
    # The peers started together ([job] min_peers) and ended together: one model.pt.
    assert saved[0]["consensus_digest"] == saved[1]["consensus_digest"]
    each = [s["metrics"]["consensus_mse"] for s in saved]  # one model, each peer's own test data
    headline = (f"mse of the saved model: {_num(sum(each) / 2)} (mean over the peers' own test data: "
                f"peer-0 {_num(each[0])}, peer-1 {_num(each[1])}) "
                "(lower is better; model.pt, the consensus of 2 peers, the same on every peer)")
    assert headline in out.stdout and own in out.stdout, out.stdout
    assert "accuracy" not in out.stdout


def test_the_headline_is_the_saved_models_metric(tmp_path):
    """From each worker's model.json: one model (one consensus_digest) or several,
    in the job's metric and its direction."""
    from peerd.cli.cluster import _headline, _saved
    from peerd.settings.jobspec import parse_job

    def row(peer: str, own: float, consensus: float, digest: str) -> dict:
        folder = tmp_path / peer
        folder.mkdir()
        (folder / "model.json").write_text(json.dumps({
            "consensus": ["peer-0", "peer-1", "peer-2"], "consensus_digest": digest, "metric": "accuracy",
            "metrics": {"accuracy": own, "consensus_accuracy": consensus, "consensus_peers": 3.0}}))
        # the last progress report's values differ: model.json is what counts
        return {"peer": peer, "metric": 0.0, "consensus": 0.0, "dir": str(folder)}

    accuracy = parse_job('[job]\nname = "a"\nmodule = "m"\n', "job")
    rows = [row("peer-0", 0.95, 0.97, "d1"), row("peer-1", 0.96, 0.97, "d1"), row("peer-2", 0.94, 0.97, "d1")]
    line, same = _headline([_saved(r, "accuracy") for r in rows], accuracy, 61.2)
    assert same and line == ("test accuracy of the saved model: 0.9700 (higher is better; model.pt, the consensus of "
                             "3 peers, the same on every peer); each peer's own model: peer-0 0.9500, peer-1 0.9600, "
                             "peer-2 0.9400; in 61s")

    tmp_path = tmp_path / "split"
    tmp_path.mkdir()
    rows = [row("peer-0", 0.95, 0.97, "d1"), row("peer-1", 0.96, 0.97, "d1"), row("peer-2", 0.94, 0.93, "d2")]
    line, same = _headline([_saved(r, "accuracy") for r in rows], accuracy, 61.2)
    assert not same and line.startswith(
        "test accuracy of the saved models (higher is better): the peers saved 2 different models (consensus_digest "
        "in model.json): peer-0, peer-1: 0.9700, 0.9700 (consensus d1); peer-2: 0.9300 (consensus d2); each peer's "
        "own model: peer-0 0.9500")

    loss = parse_job('[job]\nname = "l"\nmodule = "m"\nmetric = "val_loss"\n', "job")
    gone = {"peer": "peer-0", "metric": 1.5, "consensus": 1.25, "dir": str(tmp_path / "none")}
    line, same = _headline([_saved(gone, "val_loss")], loss, 5)
    assert not same and line == ("val_loss of the saved models (lower is better): not every peer's model.json could "
                                 "be read: peer-0: 1.2500 (model.json not readable); each peer's own model: peer-0 "
                                 "1.5000; in 5s")


def test_a_collapsed_run_says_so_at_the_end_and_exits_1(tmp_path):
    """From model.json's collapse_reason (docs/operations.md, "When training collapses"):
    each peer's last line, a line after the headline, and exit code 1."""
    import io

    from rich.console import Console

    from peerd.cli.cluster import _summary
    from peerd.settings.jobspec import parse_job

    why = "training collapsed at round 50 (loss blow-up): loss 76.2 (first step 2.3) over the last 50 steps"

    def run(collapsed: bool) -> tuple[int, str]:
        rows = []
        for peer in ("peer-0", "peer-1"):
            folder = tmp_path / f"{peer}-{collapsed}"
            folder.mkdir()
            (folder / "model.json").write_text(json.dumps({
                "consensus": ["peer-0", "peer-1"], "consensus_digest": "d1", "metrics": {"accuracy": 0.089},
                "collapsed": collapsed, "collapse_reason": why if collapsed else ""}))
            rows.append({"peer": peer, "state": "finished", "step": 125, "metric": 0.089, "consensus": 0.089,
                         "dir": str(folder), "collapse": why if collapsed else ""})
        out = io.StringIO()
        code = _summary(rows, tmp_path, 14.0, Console(file=out, width=1000), parse_job(example_job(), "job"))
        return code, out.getvalue()

    code, text = run(collapsed=True)
    assert code == 1 and f"peer-0: finished, collapsed ({why}), 125 steps" in text
    assert f"training collapsed (peer-0: {why}; peer-1: {why}); the saved model is marked collapsed" in text
    code, text = run(collapsed=False)
    assert code == 0 and "collapsed (" not in text and "training collapsed" not in text


def cluster_cli(capsys, *args: str) -> tuple[int, str]:
    """`peerd cluster ARGS` in this process, for the refusals that start nothing:
    the exit code and what it printed, whitespace made single spaces."""
    code = peerd_main(["cluster", *args])
    return code, " ".join(capsys.readouterr().out.split())


def test_peerd_cluster_refuses_data_roots_that_do_not_fit_the_peers(tmp_path, capsys):
    job = lsq_job(tmp_path)
    run = tmp_path / "run"
    (tmp_path / "a").mkdir()
    (tmp_path / "data" / "peer-0").mkdir(parents=True)
    (tmp_path / "data" / "peer-2").mkdir()
    cases = {
        (): "job 'lsq' keeps its data on each peer (data_mode = 'local'): give each of the 3 peers its data root, "
            "--data-dir DIR (holding peer-0/ … peer-2/) or --data-root DIR once per peer",
        ("--peers", "2", "--data-root", str(tmp_path / "a")): "--data-root given 1 time for --peers 2: give one "
                                                             "data root per peer, peer-0's first",
        ("--data-root", str(tmp_path / "a"), "--data-root", str(tmp_path / "b")):
            f"--data-root {tmp_path / 'b'} (peer-1's) is not a directory",
        ("--data-dir", str(tmp_path / "data")): f"--data-dir {tmp_path / 'data'} lacks peer-1/ (it has peer-2/): "
                                                "it needs one folder per peer, peer-0/ … peer-1/",
        ("--peers", "3", "--data-dir", str(tmp_path / "data")): "lacks peer-1/: it needs one folder per peer, "
                                                                "peer-0/ … peer-2/",
        ("--data-dir", str(tmp_path / "a")): "holds no peer-0/ folder",
        ("--data-dir", str(tmp_path / "none")): f"--data-dir {tmp_path / 'none'} is not a directory",
        ("--data-root", str(tmp_path / "a"), "--workers", "2"): "--workers > 1 with local data",
    }
    for args, message in cases.items():
        code, printed = cluster_cli(capsys, "--job", str(job), "--out", str(run), *args)
        assert code == 2 and f"peerd cluster: " in printed and message in printed, (args, printed)
        assert not run.exists()  # nothing started, nothing left behind

    shared = tmp_path / "shared.toml"
    shared.write_text(example_job(job={"name": "shared"}))
    code, printed = cluster_cli(capsys, "--job", str(shared), "--out", str(run), "--data-root", str(tmp_path / "a"))
    assert code == 2 and "reads shared data (data_mode = 'shared')" in printed

    with pytest.raises(SystemExit) as exit_:
        peerd_main(["cluster", "--job", str(job), "--data-dir", str(tmp_path / "data"), "--data-root", str(tmp_path)])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_peerd_cluster_keeps_the_jobs_own_min_peers_and_refuses_one_it_cannot_reach(tmp_path, capsys):
    from peerd.cli.localcluster import cluster_job_text
    from peerd.settings.jobspec import load_job

    job = lsq_job(tmp_path, min_peers=2)
    spec, text = load_job(job)
    handed, notes = cluster_job_text(text + '[data]\nroot = "one"\n', spec, 3, own_roots=True)
    assert tomllib.loads(handed)["job"]["min_peers"] == 2 and "data" not in tomllib.loads(handed)
    assert notes == ["the job's [data] root is left out: each peer reads its own data root"]

    code, printed = cluster_cli(capsys, "--job", str(job), "--out", str(tmp_path / "run"), "--peers", "1",
                                "--data-root", str(tmp_path))
    assert code == 2 and "sets min_peers = 2, more than the cluster's workers (1): it would never start" in printed

    plain, text = load_job(lsq_job(tmp_path))
    handed, notes = cluster_job_text(text, plain, 6, own_roots=True)
    handed = tomllib.loads(handed)
    assert handed["job"].pop("min_peers") == 6 and notes == ["min_peers = 6: the workers start together"]
    assert handed == tomllib.loads(text)  # nothing else changed


def test_data_roots_given_once_per_peer_go_to_the_peers_in_order(tmp_path, monkeypatch):
    from peerd.cli.localcluster import LocalDaemon, data_roots, local_data_settings
    from peerd.settings.jobspec import load_job

    spec, _ = load_job(lsq_job(tmp_path))
    for name in ("b", "a", "c"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    roots = data_roots(None, [Path("b"), Path("a"), tmp_path / "c"])  # relative: to the current directory
    assert roots == [tmp_path / "b", tmp_path / "a", tmp_path / "c"]
    (tmp_path / "run").mkdir()
    settings = local_data_settings(spec, tmp_path / "run", len(roots), roots=roots)
    assert [settings(LocalDaemon(k, tmp_path, tmp_path))["data"]["root"] for k in range(3)] == [str(r) for r in roots]
    secret = settings(LocalDaemon(0, tmp_path, tmp_path))["auth"]["job_secret_file"]
    assert secret == str(tmp_path / "run" / "job.secret")
    assert data_roots(None) is None


def test_the_tensorboard_line_names_the_runs_folder_or_the_jobs_own_or_says_the_package_is_missing(
        tmp_path, monkeypatch):
    import importlib.util

    from peerd.cli.cluster import _tensorboard_note
    from peerd.settings.jobspec import parse_job

    job, ours = tmp_path / "job.toml", tmp_path / "run" / "tensorboard"
    plain = parse_job('[job]\nname = "a"\nmodule = "m"\n', str(job))
    own = parse_job('[job]\nname = "a"\nmodule = "m"\n[log]\ntensorboard = "tb"\n', str(job))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert _tensorboard_note(plain, job, ours) == f"TensorBoard: tensorboard --logdir {ours}"
    assert _tensorboard_note(own, job, ours) == f"TensorBoard: tensorboard --logdir {tmp_path.resolve() / 'tb'}"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "pip install peerd[tensorboard]" in _tensorboard_note(plain, job, ours)
