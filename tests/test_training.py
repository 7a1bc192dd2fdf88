"""The worker's local half: model loading errors, data shards, epochs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from peerd.errors import ConfigError
from peerd.jobspec import parse_job
from peerd.worker.training import Trainer

JOBCODE = str(Path(__file__).parent / "jobcode")


def spec(model: str = "tiny_job:make_model", data: str = "tiny_job:make_data", **job):
    extra = "".join(f"{k} = {v}\n" for k, v in job.items())
    return parse_job(f'[job]\nname = "tiny"\nmodel = "{model}"\ndata = "{data}"\nlocal_batch = 2\n{extra}', "test")


def test_one_epoch_reads_exactly_this_peers_shard():
    members = ["a", "b"]
    trainers = [Trainer(spec(epochs=1), me, JOBCODE) for me in members]
    for t in trainers:
        while not t.done:
            t.step(members)
    assert [t.samples for t in trainers] == [3, 3]
    assert all(t.progress == 1.0 for t in trainers)


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
            'reference_batch = 4\nramp_steps = 8\n')
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
    assert t.samples == 3 * 3  # 3 epochs of a 3-sample shard
    assert t.progress == 3.0


def test_device_names_are_resolved_or_refused_clearly():
    from peerd.errors import ConfigError
    from peerd.worker.training import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    t = Trainer(spec(epochs=1), "a", JOBCODE, device="auto")
    assert t.flat.vector.device == t.device
    assert t.momentum.device == t.device
    t.step(["a"])
    assert t.loss_ema == t.loss_ema  # a number: the step ran on that device
