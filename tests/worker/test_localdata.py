"""data_mode = "local": each peer trains on its own data; the weighting keeps the objective.

Least squares, where the answers are known in closed form: three peers hold
slices of different sizes drawn from different linear models (non-IID), so the
pooled solution (every sample counts once, `samples`) and the mean of the
per-peer objectives' solution (`uniform`) are far apart, and a test that lands
on the right one cannot do so by accident.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from peerd.core.shares import BatchPlan
from peerd.core.topology import plan_round
from peerd.core.weighting import Weights, union_epochs, weigh
from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import Trainer

JOBCODE = str(Path(__file__).parents[1] / "jobcode")
SIZES = {"a": 40, "b": 10, "c": 25}
TRUTH = {"a": (1.0, 0.0, 0.0), "b": (-2.0, 3.0, 0.0), "c": (0.0, -1.0, 2.0)}  # each peer's own model
MEMBERS = sorted(SIZES)


def write_data(root: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each peer's (A, y) in its own data root; returned in float64 for the closed forms."""
    data = {}
    for k, peer in enumerate(MEMBERS):
        gen = torch.Generator().manual_seed(10 + k)
        a = torch.randn(SIZES[peer], 3, generator=gen, dtype=torch.float64)
        y = a @ torch.tensor(TRUTH[peer], dtype=torch.float64) + 0.1 * torch.randn(SIZES[peer], generator=gen,
                                                                                    dtype=torch.float64)
        (root / peer).mkdir(parents=True)
        torch.save((a.float(), y.float()), root / peer / "lsq.pt")
        data[peer] = (a.float().double(), y.float().double())  # exactly what the peers read
    return data


def pooled_solution(data) -> torch.Tensor:
    """argmin Σ_i Σ_{s∈D_i} (a_s·x − y_s)²: every sample counts once."""
    return torch.linalg.solve(sum(a.T @ a for a, _ in data.values()), sum(a.T @ y for a, y in data.values()))


def uniform_solution(data) -> torch.Tensor:
    """argmin Σ_i (1/n_i) Σ_{s∈D_i} (a_s·x − y_s)²: every peer's data counts equally."""
    return torch.linalg.solve(sum(a.T @ a / len(y) for a, y in data.values()),
                              sum(a.T @ y / len(y) for a, y in data.values()))


def job_text(weighting: str, epochs: int, lr: float, schedule: str, **job) -> str:
    values = {"weighting": weighting, "epochs": epochs, "local_batch": 5, **job}
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return ('[job]\nname = "lsq"\nmodule = "lsq_job"\ndata_mode = "local"\nmetric = "loss"\n'
            f'{lines}[optimizer]\nlr = {lr}\nmomentum = 0.0\nschedule = "{schedule}"\n')


def trainers(text: str, root: Path) -> list[Trainer]:
    spec = parse_job(text, "test")
    out = [Trainer(spec, peer, JOBCODE, data_root=str(root / peer)) for peer in MEMBERS]
    for t in out:
        t.set_data_sizes(SIZES)  # what the members publish (the daemons relay it)
    return out


def exact_average(ts: list[Trainer], round_: int) -> None:
    mean = torch.stack([t.flat.vector for t in ts]).mean(0)
    for t in ts:
        t.flat.vector.copy_(mean)


def gossip(ts: list[Trainer], round_: int) -> None:
    """One round of peerd's flat gossip, whole model: θ_i ← ½(θ_i + θ_σ(i)) with σ
    the round's derangement (peerd.core.topology): doubly stochastic."""
    before = {t.peer_id: t.flat.vector.clone() for t in ts}
    for t in ts:
        source = plan_round("lsq", round_, MEMBERS, t.peer_id, 1).sources[0]
        t.flat.vector.copy_(0.5 * (before[t.peer_id] + before[source]))


def train(ts: list[Trainer], mix, plan: BatchPlan | None) -> torch.Tensor:
    """Step every peer, mix, until the job is done; the mean model."""
    round_ = 0
    while not ts[0].done:
        for t in ts:
            t.step(MEMBERS, plan=plan)
        mix(ts, round_)
        terms = {t.peer_id: t.epochs_read for t in ts}  # what the daemons relay
        for t in ts:
            t.set_data_sizes(SIZES, terms)
        round_ += 1
    assert all(t.done for t in ts)
    return torch.stack([t.flat.vector for t in ts]).mean(0).double()


# --- the pure weighting --------------------------------------------------------


def test_samples_weights_are_sizes_over_their_mean_and_uniform_is_one():
    w = weigh(SIZES, MEMBERS, "samples")
    assert w.lr == pytest.approx({"a": 40 / 25, "b": 10 / 25, "c": 25 / 25})
    assert w.union == 75
    assert weigh(SIZES, MEMBERS, "uniform") == Weights({"a": 1.0, "b": 1.0, "c": 1.0}, 75.0)


def test_a_member_without_a_published_size_counts_as_the_mean():
    w = weigh({"a": 40, "b": 10}, ["a", "b", "c"], "samples")
    assert w.union == 75 and w.of("c") == pytest.approx(1.0)
    assert weigh({}, ["a", "b"], "samples").lr == {"a": 1.0, "b": 1.0}
    assert union_epochs(150, 75) == 2


def test_the_weighted_mean_gradient_is_the_gradient_over_the_union():
    """The derivation in one line: (1/m) Σ w_i ∇f_i = ∇F with F the mean loss over the union."""
    data = write_data_in_memory()
    x = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    grad = {p: a.T @ (a @ x - y) / len(y) for p, (a, y) in data.items()}  # ∇f_i, f_i = ½ mean over D_i
    w = weigh(SIZES, MEMBERS, "samples")
    mean_update = sum(w.of(p) * grad[p] for p in MEMBERS) / len(MEMBERS)
    a_all = torch.cat([a for a, _ in data.values()])
    y_all = torch.cat([y for _, y in data.values()])
    torch.testing.assert_close(mean_update, a_all.T @ (a_all @ x - y_all) / len(y_all))


def write_data_in_memory():
    out = {}
    for k, peer in enumerate(MEMBERS):
        gen = torch.Generator().manual_seed(10 + k)
        a = torch.randn(SIZES[peer], 3, generator=gen, dtype=torch.float64)
        out[peer] = (a, a @ torch.tensor(TRUTH[peer], dtype=torch.float64))
    return out


# --- through the real Trainer ----------------------------------------------------

# Full batch (every peer's batch is its whole data set, given by a DBS plan) with an
# exact average after every step: the mean model takes exact gradient-descent steps on
# the job's objective, so it reaches the closed form to float32 precision.
FULL_BATCH_TOL = 1e-4
# Mini-batches (with and without DBS batches that ignore the sizes) and real gossip
# (pairwise derangement averaging): SGD noise and the peers' disagreement both
# shrink as the LR decays linearly to 0. What is left was measured at 0.003-0.009
# (the run is deterministic: seeded data and orders); the bound is 0.03, ≥ 20×
# below the distance between the two solutions (≥ 0.6 here) and to where weighting
# by batch size would lead (≥ 1.1), so the test tells them apart.
SGD_TOL = 0.03
DBS_BATCHES = {"a": 2, "b": 9, "c": 4}


def batch_weighted_solution(data) -> torch.Tensor:
    """Where scaling each LR by b_i (the shared mode's DBS rule) would go with local data:
    argmin Σ_i b_i f_i, the peers weighted by speed."""
    return torch.linalg.solve(sum(DBS_BATCHES[p] * a.T @ a / len(y) for p, (a, y) in data.items()),
                              sum(DBS_BATCHES[p] * a.T @ y / len(y) for p, (a, y) in data.items()))


@pytest.mark.parametrize("weighting, solution", [("samples", pooled_solution), ("uniform", uniform_solution)])
def test_full_batch_local_data_reaches_the_closed_form(tmp_path, weighting, solution):
    data = write_data(tmp_path)
    ts = trainers(job_text(weighting, epochs=200, lr=0.5, schedule="constant", global_batch=75), tmp_path)
    full = BatchPlan(tuple(sorted(SIZES.items())))  # b_i = n_i
    x = train(ts, exact_average, full)
    expected = solution(data)
    assert (x - expected).norm() <= FULL_BATCH_TOL, (x, expected)
    assert (pooled_solution(data) - uniform_solution(data)).norm() > 0.6
    w = weigh(SIZES, MEMBERS, weighting)
    assert [t.lr for t in ts] == pytest.approx([0.5 * w.of(p) for p in MEMBERS])


@pytest.mark.parametrize("dbs", [False, True], ids=["fixed-batch", "dbs"])
@pytest.mark.parametrize("weighting, solution", [("samples", pooled_solution), ("uniform", uniform_solution)])
def test_minibatch_gossip_converges_to_the_closed_form(tmp_path, weighting, solution, dbs):
    """Different sizes, different speeds: DBS gives the peer with the least data the
    largest batch (as if it were the fastest) and the one with the most the smallest."""
    data = write_data(tmp_path)
    extra = {"global_batch": 15} if dbs else {}
    ts = trainers(job_text(weighting, epochs=150, lr=0.2, schedule="linear", **extra), tmp_path)
    plan = BatchPlan(tuple(sorted(DBS_BATCHES.items()))) if dbs else None
    x = train(ts, gossip, plan)
    expected, other = solution(data), (uniform_solution if solution is pooled_solution else pooled_solution)(data)
    assert (x - expected).norm() <= SGD_TOL, (x, expected)
    assert (x - other).norm() > 20 * SGD_TOL
    assert (x - batch_weighted_solution(data)).norm() > 20 * SGD_TOL
    assert ts[0].progress == pytest.approx(150, abs=15 / 75)  # epochs of the union: global samples / 75


def test_each_peer_reads_its_whole_data_set_once_per_local_epoch(tmp_path):
    write_data(tmp_path)
    t = trainers(job_text("samples", epochs=100, lr=0.1, schedule="constant"), tmp_path)[1]  # b: 10 samples
    seen = []
    for _ in range(4):  # local_batch 5: two local epochs
        t.step(MEMBERS)
        seen.append(t.last_indices)
    assert sorted(seen[0] + seen[1]) == sorted(seen[2] + seen[3]) == list(range(10))
    assert seen[0] + seen[1] != seen[2] + seen[3]  # a fresh order each local epoch
    # Three peers × 5 samples per step over a union of 75: a fifth of an epoch per
    # step (the others' terms, relayed by the daemons, are not in yet).
    assert t.progress == pytest.approx(4 * 15 / 75)


def test_local_mode_needs_make_datasets_to_take_the_context(tmp_path):
    text = ('[job]\nname = "t"\nmodel = "tiny_job:make_model"\ndata = "tiny_job:make_data"\n'
            'data_mode = "local"\n')
    with pytest.raises(ConfigError, match="make_datasets\\(ctx\\)"):
        Trainer(parse_job(text, "test"), "a", JOBCODE, data_root=str(tmp_path))


def test_a_peer_without_the_data_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="no lsq.pt in this peer's data root"):
        Trainer(parse_job(job_text("samples", 1, 0.1, "constant"), "test"), "a", JOBCODE,
                data_root=str(tmp_path / "nothing"))


def test_a_newcomer_takes_the_jobs_progress_and_reads_its_own_data(tmp_path):
    write_data(tmp_path)
    a, b, _ = trainers(job_text("samples", epochs=10, lr=0.1, schedule="cosine"), tmp_path)
    for _ in range(7):
        a.step(MEMBERS)
    b.adopt_state(a.state.vector(), a.state.extra(), a.step_count, a.progress)
    b.step(MEMBERS)
    assert b.progress == pytest.approx(a.progress + 15 / 75)  # the job's clock came with the state
    assert max(b.last_indices) < SIZES["b"]
    assert math.isclose(b.lr, a.lr / SIZES["a"] * SIZES["b"], rel_tol=0.05)  # same schedule, own weight


# --- who may take part: a secret and the data ---------------------------------------


def local_spec(root: str = ""):
    data = f'[data]\nroot = "{root}"\n' if root else ""
    return parse_job(job_text("samples", 1, 0.1, "constant") + data, "test")


def test_a_local_job_needs_a_secret_and_a_data_root(tmp_path):
    from peerd.daemon.localdata import check_local_job

    secret = tmp_path / "job.secret"
    with pytest.raises(ConfigError, match="needs a job secret.*peerctl secret FILE"):
        check_local_job(local_spec(), "", None, tmp_path)
    with pytest.raises(ConfigError, match="names no data root.*\\[data\\] root"):
        check_local_job(local_spec(), "", secret, None)
    with pytest.raises(ConfigError, match="is not a directory; this peer holds no data for the job"):
        check_local_job(local_spec(), "", secret, tmp_path / "absent")
    assert check_local_job(local_spec(), "", secret, tmp_path) == str(tmp_path)
    (tmp_path / "mine").mkdir()
    assert check_local_job(local_spec("mine"), str(tmp_path), secret, None) == str(tmp_path / "mine")
    shared = parse_job('[job]\nname = "s"\nmodel = "m:f"\ndata = "d:g"\n', "test")
    assert check_local_job(shared, "", None, None) == ""  # shared-data jobs: as before


def test_a_local_worker_without_a_secret_exits_as_a_config_error(tmp_path):
    from peerd.core.codes import ExitCode
    from peerd.worker.main import main

    job = tmp_path / "job.toml"
    job.write_text(job_text("samples", 1, 0.1, "constant"))
    code = main(["--control", f"unix:{tmp_path}/none.sock", "--spec", str(job), "--spec-dir", JOBCODE,
                 "--peer-id", "a", "--data-root", str(tmp_path)])
    assert code == ExitCode.CONFIG


def test_peerctl_writes_a_secret_only_its_owner_can_read(tmp_path, capsys):
    import os
    import stat

    from peerd.security.auth import load_secret
    from peerd.cli import peerctl

    path = tmp_path / "job.secret"
    old = os.umask(0o000)  # a careless umask must not widen the file
    try:
        assert peerctl.main(["--socket", str(tmp_path / "no.sock"), "secret", str(path)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = load_secret(path)
    assert len(first) >= 32 and "mode 0600" in capsys.readouterr().out
    assert peerctl.main(["secret", str(path)]) == 1  # kept: every peer must hold the same one
    assert "exists" in capsys.readouterr().err and load_secret(path) == first
    path.chmod(0o644)
    assert peerctl.main(["secret", "--force", str(path)]) == 0
    assert load_secret(path) != first and stat.S_IMODE(path.stat().st_mode) == 0o600


# --- the non-IID digits -------------------------------------------------------------


@pytest.mark.parametrize("peers", [1, 3, 5, 10])
def test_the_digits_split_by_label_gives_every_class_to_exactly_one_peer(peers):
    from peerd.examples.noniid import classes_of

    held = [classes_of(k, peers) for k in range(peers)]
    assert sorted(c for h in held for c in h) == list(range(10))
    assert all(h for h in held) and max(map(len, held)) - min(map(len, held)) <= 1


def test_peerd_cluster_writes_each_peers_digits_and_a_secret(tmp_path):
    import numpy as np

    from peerd.cli.localcluster import builtin_job, local_data_settings
    from peerd.errors import PeerdError
    from peerd.settings.jobspec import load_job

    spec, _ = load_job(builtin_job("digits-noniid"))
    settings = local_data_settings(spec, tmp_path, 3)
    labels = [set(np.load(tmp_path / f"peer-{k}" / "data" / "digits" / "train.npz")["labels"]) for k in range(3)]
    assert labels == [{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}]
    assert (tmp_path / "job.secret").stat().st_mode & 0o077 == 0

    class Peer:
        index = 1
    assert settings(Peer()) == {"data": {"root": str(tmp_path / "peer-1" / "data")},
                                "auth": {"job_secret_file": str(tmp_path / "job.secret")}}
    mnist, _ = load_job(builtin_job("mnist"))
    assert local_data_settings(mnist, tmp_path, 3) is None
    with pytest.raises(PeerdError, match="among 1..10 peers"):
        local_data_settings(spec, tmp_path, 11)


def test_loader_workers_count_the_jobs_progress_from_the_first_step(tmp_path):
    """Worker processes read batches ahead as soon as the loader starts: each of
    those steps must already count its samples in the union."""
    write_data(tmp_path)
    text = job_text("samples", epochs=100, lr=0.1, schedule="constant") + "[data]\nloader_workers = 1\n"
    t = trainers(text, tmp_path)[0]
    try:
        for _ in range(3):
            t.step(MEMBERS)
        assert t.progress == pytest.approx(3 * 15 / 75)
    finally:
        t.close()


def test_the_random_split_gives_disjoint_equal_slices_of_every_class(tmp_path):
    import numpy as np

    from peerd.examples.noniid import write_split

    roots = [tmp_path / f"s{k}" for k in range(4)]
    assert write_split(roots, by_label=False) == [1000] * 4
    parts = [np.load(r / "digits" / "train.npz") for r in roots]
    assert all(set(p["labels"]) == set(range(10)) for p in parts)
    from peerd.examples.noniid import TEST_SIZE, bundled

    _, labels = bundled()  # every training digit in exactly one slice: the label counts add up
    assert (np.bincount(np.concatenate([p["labels"] for p in parts]), minlength=10)
            == np.bincount(labels[TEST_SIZE:], minlength=10)).all()


def test_the_jobs_clock_adds_up_each_peers_steps_once(tmp_path):
    """The job's epochs are the sum of each peer's term (its steps' samples over the
    union); a term heard twice or late counts once, a stale one takes nothing
    back, and the clock comes with the state to a peer that takes it. Between
    terms a peer counts the whole global batch at each of its steps."""
    write_data(tmp_path)
    a, b, c = trainers(job_text("samples", epochs=10, lr=0.1, schedule="cosine"), tmp_path)
    for t in (a, b, c):
        t.set_data_sizes(SIZES)
    for _ in range(5):
        a.step(MEMBERS)
    b.step(MEMBERS)
    assert a.epochs_read == pytest.approx(5 * 5 / 75)  # its own samples over the union
    assert a.progress == pytest.approx(5 * 15 / 75)  # ... and the others' steps, estimated
    assert b.progress == pytest.approx(15 / 75)
    b.set_data_sizes(SIZES, {"a": a.epochs_read})
    assert b.progress == pytest.approx(a.epochs_read + b.epochs_read)  # 0.4: more than its estimate
    b.set_data_sizes(SIZES, {"a": a.epochs_read, "b": 0.0})  # heard again: counted once
    assert b.progress == pytest.approx(a.epochs_read + b.epochs_read)
    before = b.progress
    b.set_data_sizes(SIZES, {"a": a.epochs_read / 2})  # a stale term takes nothing back
    assert b.progress == before
    c.adopt_state(b.state.vector(), b.state.extra(), b.step_count, b.progress)
    assert c.progress == pytest.approx(before) and c.epochs_read == 0.0


def test_local_data_plans_every_member_at_the_full_period_shared_data_fewer_for_slow_ones():
    from peerd.worker.engine import rebalancer_of

    gossip = "[gossip]\nperiod_steps = 4\n"
    local = parse_job(job_text("samples", 1, 0.1, "constant", global_batch=60, min_local_batch=4) + gossip, "test")
    assert rebalancer_of(local).period == 1  # plan_round gives nobody fewer steps
    shared = parse_job(local_text_as_shared(job_text("samples", 1, 0.1, "constant", global_batch=60,
                                                     min_local_batch=4)) + gossip, "test")
    assert rebalancer_of(shared).period == 4
    slow = rebalancer_of(shared)
    slow.update(0, ["a", "b", "c"], {"a": 100.0, "b": 100.0, "c": 100.0}, {"c": 1.0})
    assert slow.plan.round_steps("c", 4) < 4


def local_text_as_shared(text: str) -> str:
    return text.replace('data_mode = "local"\n', "").replace('weighting = "samples"\n', "")
