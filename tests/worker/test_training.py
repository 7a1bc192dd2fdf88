"""The worker's local half: model loading errors, data shards, epochs."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from peerd.core.shares import BatchPlan
from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import Trainer

JOBCODE = str(Path(__file__).parents[1] / "jobcode")


def spec(model: str = "tiny_job:make_model", data: str = "tiny_job:make_data", **job):
    extra = "".join(f"{k} = {v}\n" for k, v in job.items())
    return parse_job(f'[job]\nname = "tiny"\nmodel = "{model}"\ndata = "{data}"\nlocal_batch = 2\n{extra}', "test")


def test_one_epoch_reads_exactly_this_peers_shard():
    members = ["a", "b"]
    trainers = [Trainer(spec(epochs=1), me, JOBCODE) for me in members]
    for t in trainers:
        while not t.done:
            t.step(members)
    # 3 samples each in batches of 2: the job's last batch would hold one
    # sample, which is read but not trained on (BatchNorm cannot train on one).
    assert [t.samples for t in trainers] == [2, 2]
    assert all(t.progress == 1.0 for t in trainers)


def test_batches_run_on_across_epoch_ends_so_only_the_jobs_last_one_is_short():
    t = Trainer(spec(epochs=3), "a", JOBCODE)  # a 3-sample shard of 6 in batches of 2
    sizes, epochs = [], []
    while not t.done:
        before = t.samples
        t.step(["a", "b"])
        if t.samples > before:
            sizes.append(t.samples - before)
            epochs.append(t.progress)
    assert sizes == [2, 2, 2, 2]  # not 2, 1, 2, 1, 2, 1
    assert epochs[1] > 1.0 and t.progress == 3.0


def test_more_peers_than_samples_still_finishes():
    members = [f"p{i}" for i in range(10)]
    t = Trainer(spec(epochs=2), "p0", JOBCODE)
    for _ in range(20):
        if t.done:
            break
        t.step(members)
    assert t.done and t.samples <= 2


def test_training_changes_the_flat_vector_the_params_view():
    t = Trainer(spec(epochs=1), "a", JOBCODE)
    before = t.flat.vector.clone()
    loss = t.step(["a"])
    assert not math.isnan(loss)
    assert not torch.equal(before, t.flat.vector)
    assert t.model.weight.data_ptr() == t.flat.vector.data_ptr()


@pytest.mark.parametrize("entry, message", [
    ("no_such_module:make_model", "no module named 'no_such_module'"),
    ("tiny_job:missing", "has no 'missing'"),
    ("tiny_job:broken_model", "no GPU of that kind here"),
    ("tiny_job:no_params_model", "no trainable parameters"),
])
def test_a_job_that_cannot_load_is_a_config_error(entry, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(spec(model=entry), "a", JOBCODE)


def test_more_peers_ramp_the_lr_up_smoothly_and_keep_momentum():
    job = spec(epochs=100)
    text = ('[job]\nname = "tiny"\nmodel = "tiny_job:make_model"\ndata = "tiny_job:make_data"\n'
            'local_batch = 2\nepochs = 100\n[optimizer]\nlr = 0.1\nschedule = "constant"\n'
            'reference_batch = 4\nramp_steps = 8\nscaling = "linear"\nmax_scale = inf\n')
    job = parse_job(text, "test")
    t = Trainer(job, "a", JOBCODE)
    for _ in range(3):
        t.step(["a", "b"])  # global batch 4 = reference: lr as written
    assert t.lr == pytest.approx(0.1)
    momentum = t.optimizer.state[t.model.weight]["momentum_buffer"].clone()
    lrs = [(t.step(["a", "b", "c", "d"]), t.lr)[1] for _ in range(20)]  # batch ×2: ramp over 16 steps
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[8] == pytest.approx(0.15)
    assert lrs[16:] == pytest.approx([0.2] * 4)
    assert all(b >= a for a, b in zip(lrs, lrs[1:]))
    # The momentum buffer was carried on, not reset: it still has the old direction in it.
    assert torch.nn.functional.cosine_similarity(
        momentum.flatten(), t.optimizer.state[t.model.weight]["momentum_buffer"].flatten(), dim=0) > 0


def test_every_epoch_of_the_job_is_trained():
    t = Trainer(spec(epochs=3), "a", JOBCODE)
    steps = 0
    while not t.done and steps < 100:
        t.step(["a", "b"])
        steps += 1
    # 3 epochs of a 3-sample shard, in batches of 2 that run on across the
    # epoch ends: the job's last one (one sample) is read, not trained on.
    assert t.samples == 3 * 3 - 1
    assert t.progress == 3.0


def test_device_names_are_resolved_or_refused_clearly():
    from peerd.errors import ConfigError
    from peerd.worker.train.trainer import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    t = Trainer(spec(epochs=1), "a", JOBCODE, device="auto")
    assert t.flat.vector.device == t.device
    assert all(part.device == t.device for part in t.state.parts())
    t.step(["a"])
    assert t.loss_ema == t.loss_ema  # a number: the step ran on that device


def _read(t: Trainer, plan: BatchPlan, members: list[str]) -> list[int]:
    """Take one step and return the sample indices it read (also kept in t.batches)."""
    t.step(members, plan=plan)
    t.batches = [*vars(t).get("batches", []), t.last_indices]
    return t.last_indices


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_heterogeneous_batches_averaged_equal_one_large_batch_step(momentum):
    """DBS with unweighted averaging: each peer's LR is scaled by b_i / mean(b), so
    the mean of the models after one step each is one SGD step of batch Σb on the
    union of their samples; with momentum too, over two steps with an exact
    average in between (what gossip converges to)."""
    members = ["a", "b", "c"]
    plan = BatchPlan((("a", 19), ("b", 8), ("c", 3)))
    job = parse_job(_dbs_text(momentum), "test")
    trainers = [Trainer(job, m, JOBCODE) for m in members]
    ref = copy.deepcopy(trainers[0].model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=momentum, weight_decay=0.001)
    x, y = trainers[0].train_set.tensors
    for _ in range(2):
        union = [i for t in trainers for i in _read(t, plan, members)]
        assert len(union) == 30 == len(set(union))
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[union]), y[union]).backward()
        ref_opt.step()
        mean = torch.stack([t.flat.vector for t in trainers]).mean(0)
        expected = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        assert torch.allclose(mean, expected, rtol=1e-5, atol=1e-6)
        # The models did move apart: the equality is not that of three identical steps.
        assert not torch.allclose(trainers[0].flat.vector, trainers[2].flat.vector, atol=1e-4)
        for t in trainers:
            t.flat.vector.copy_(mean)
    assert [t.lr for t in trainers] == pytest.approx([0.2 * 19 / 10, 0.2 * 8 / 10, 0.2 * 3 / 10])


def _dbs_text(momentum: float, **job) -> str:
    values = {"epochs": 50, "global_batch": 30, **job}
    extra = "".join(f"{k} = {v}\n" for k, v in values.items())
    return ('[job]\nname = "dbs"\nmodel = "tiny_job:small_model"\ndata = "tiny_job:small_data"\n'
            f'{extra}[optimizer]\nlr = 0.2\nmomentum = {momentum}\n'
            'weight_decay = 0.001\nschedule = "constant"\nreference_batch = 30\n')


def test_micro_batches_accumulate_to_the_full_batch_gradient():
    plan = BatchPlan((("a", 23),))
    whole = Trainer(parse_job(_dbs_text(0.9), "t"), "a", JOBCODE)
    split = Trainer(parse_job(_dbs_text(0.9, max_local_batch=5), "t"), "a", JOBCODE)
    for _ in range(3):
        assert whole.step(["a"], plan=plan) == pytest.approx(split.step(["a"], plan=plan), rel=1e-5)
    assert split.local_batch == 23
    assert torch.allclose(whole.flat.vector, split.flat.vector, rtol=1e-5, atol=1e-6)


def test_shares_are_fixed_for_a_chunk_and_the_batch_follows_the_plan():
    """A plan change mid-chunk changes the batches at once but not the chunk's
    split; the next chunks are split by the new shares. Every sample of the epoch
    is still read exactly once."""
    members = ["a", "b"]
    first, second = BatchPlan((("a", 20), ("b", 10))), BatchPlan((("a", 6), ("b", 24)))
    job = parse_job(_dbs_text(0.0, epoch_chunks=4, epochs=1), "t")  # 240 samples: chunks of 60
    trainers = {m: Trainer(job, m, JOBCODE) for m in members}
    read: dict[str, list[int]] = {m: [] for m in members}
    for m, t in trainers.items():  # one step at the first plan, inside chunk 0
        read[m] += _read(t, first, members)
    assert trainers["a"].share == pytest.approx(2 / 3)
    for m, t in trainers.items():  # the rest of the epoch at the second plan
        while t.progress < 1:
            read[m] += _read(t, second, members)
    assert sorted(read["a"] + read["b"]) == list(range(240))
    # Chunk 0 at the first shares (40 + 20), chunks 1–3 at the second (12 + 48 each).
    assert (len(read["a"]), len(read["b"])) == (40 + 3 * 12, 20 + 3 * 48)
    assert trainers["a"].share == pytest.approx(6 / 30)
    # A batch spans chunks (and epochs): only the job's last one is short.
    assert [len(b) for b in trainers["b"].batches] == [10] + [24] * 6 + [10]


def test_slowdown_below_one_is_refused():
    with pytest.raises(ConfigError, match="slowdown"):
        Trainer(spec(), "a", JOBCODE, slowdown=0.5)
    with pytest.raises(ConfigError, match="clock"):
        Trainer(spec(), "a", JOBCODE, slowdown=2.0, slowdown_clock="process")


def test_rebind_moves_the_model_into_another_vector():
    from peerd.worker.state.flatparams import FlatParams

    model = torch.nn.Linear(3, 2)
    flat = FlatParams(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    old = flat.vector
    old_values = old.clone()
    new = old.clone().add_(1.0)
    flat.rebind(new)
    assert flat.vector is new
    torch.testing.assert_close(model.weight.detach().reshape(-1), new[:6])
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # the optimizer's parameters now live in `new`
    assert not torch.equal(new, old + 1.0)
    assert torch.equal(old, old_values)  # the old vector (a snapshot now) is left alone
    with pytest.raises(ValueError):
        flat.rebind(torch.zeros(5))
