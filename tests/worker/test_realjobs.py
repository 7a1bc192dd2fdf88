"""Real jobs through the real Trainer: job modules, any torch optimizer, the whole
training state to a newcomer, data loading in worker processes, precision and
skipped steps, the model file."""

from __future__ import annotations

import importlib
import json
import logging
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.train.optim import build_optimizer, init_state
from peerd.worker.state.pull import StateMeta
from peerd.worker.train.trainer import Trainer

JOBCODE = str(Path(__file__).parents[1] / "jobcode")
MEMBERS = ["a"]


def job(module: str = "real_job", optimizer: str = 'name = "adamw"\nlr = 0.01\nbetas = [0.9, 0.95]\nweight_decay = 0.05',
        train: str = "", data: str = "", gossip: str = "", **keys) -> str:
    values = {"local_batch": 8, "epochs": 5, "epoch_chunks": 2, **keys}
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return (f'[job]\nname = "real"\nmodule = "{module}"\n{lines}[optimizer]\n{optimizer}\nschedule = "constant"\n'
            f"[train]\n{train}\n[data]\n{data}\n[gossip]\n{gossip}\n")


def trainer(text: str, peer: str = "a", spec_dir: str = JOBCODE) -> Trainer:
    return Trainer(parse_job(text, "test"), peer, spec_dir)


def module(tmp_path: Path, body: str, name: str = "variant") -> str:
    """A job module in tmp_path, built from real_job's callables (imported
    afresh: each test's variant is another module under the same name)."""
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nsys.path.insert(0, {JOBCODE!r})\nfrom real_job import *  # noqa\n" + textwrap.dedent(body))
    return name


def next_step(t: Trainer, batch, lr: float) -> None:
    """One optimizer step on a given batch, as the trainer takes it."""
    t.model.train()
    for group in t.optimizer.param_groups:
        group["lr"] = lr
    t.optimizer.zero_grad(set_to_none=True)
    loss, _ = t.code.loss(t.model, batch)
    loss.backward()
    t.optimizer.step()


def model_state(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


@pytest.mark.parametrize("gossip", ["", "average_buffers = true\naverage_optimizer_state = true"])
def test_a_newcomer_takes_the_whole_adamw_and_batchnorm_state(gossip):
    """Its next step on the same batch equals the donor's, bit for bit, and its
    evaluation of the state it took equals the donor's (BatchNorm statistics,
    Adam's moments and step count included)."""
    text = job(gossip=gossip)
    donor = trainer(text)
    for _ in range(7):
        donor.step(MEMBERS)
    newcomer = trainer(text, "b")
    assert not torch.equal(newcomer.flat.vector, donor.flat.vector)
    newcomer.adopt_state(donor.state.vector(), donor.state.extra(), donor.step_count, donor.progress)
    assert newcomer.evaluate() == donor.evaluate()
    bn = newcomer.model[1]
    assert int(bn.num_batches_tracked) == int(donor.model[1].num_batches_tracked) == 7
    batch = next(iter(torch.utils.data.DataLoader(donor.train_set, batch_size=8)))
    for t in (donor, newcomer):
        next_step(t, batch, lr=0.01)
    for key, value in model_state(donor).items():
        assert torch.equal(model_state(newcomer)[key], value), key


def test_without_the_optimizer_state_the_next_step_differs():
    """The test above can fail: a newcomer with parameters and buffers only
    (fresh Adam moments, step 0) steps differently."""
    text = job()
    donor, newcomer = trainer(text), trainer(text, "b")
    for _ in range(7):
        donor.step(MEMBERS)
    newcomer.model.load_state_dict(donor.model.state_dict())
    batch = next(iter(torch.utils.data.DataLoader(donor.train_set, batch_size=8)))
    for t in (donor, newcomer):
        next_step(t, batch, lr=0.01)
    assert not torch.equal(newcomer.flat.vector, donor.flat.vector)


def test_the_state_layout_puts_averaged_tensors_first():
    plain = trainer(job())
    both = trainer(job(gossip="average_buffers = true\naverage_optimizer_state = true"))
    params = sum(p.numel() for p in plain.model.parameters())
    assert plain.state.gossiped == params
    assert both.state.gossiped == both.state.numel == plain.state.numel
    assert plain.state.numel == params + 2 * 16 + 2 * params  # BatchNorm mean and var, Adam's two moments
    assert plain.state.fingerprint("x") != both.state.fingerprint("x")


def test_a_checkpoint_keeps_the_extra_state(tmp_path):
    t = trainer(job())
    for _ in range(3):
        t.step(MEMBERS)
    ckpts = CheckpointDir(tmp_path, "real", "fp", t.state.numel)
    ckpts.save(StateMeta(3, t.step_count, t.progress, t.state.extra()), t.state.vector())
    loaded = ckpts.load_newest()
    fresh = trainer(job(), "b")
    fresh.adopt_state(loaded.vector, loaded.meta.extra, loaded.meta.step, loaded.meta.progress)
    assert fresh.optimizer.state_dict()["state"][0]["step"] == 3
    path = ckpts.files()[0]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # a flipped bit in the extra part
    path.write_bytes(bytes(data))
    assert ckpts.load_newest() is None


@pytest.mark.parametrize("name, options", [
    ("sgd", "momentum = 0.9\nnesterov = true"), ("adam", "betas = [0.8, 0.99]"), ("adamw", "weight_decay = 0.1"),
    ("rmsprop", "alpha = 0.9\nmomentum = 0.5"), ("adagrad", "initial_accumulator_value = 0.1"), ("rprop", ""),
])
def test_the_made_up_front_state_leaves_every_optimizer_as_a_fresh_one(name, options):
    """peerd creates the optimizer state before the first exchange; the steps
    that follow are those of a fresh optimizer."""
    spec = parse_job(job(optimizer=f'name = "{name}"\nlr = 0.05\n{options}'), "test").optimizer
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    twin = nn.Linear(5, 2)
    twin.load_state_dict(model.state_dict())
    ours = build_optimizer(list(model.parameters()), spec)
    fresh = type(ours)(twin.parameters(), lr=0.05, **spec.kwargs)
    x, y = torch.randn(16, 5), torch.randn(16, 2)
    for _ in range(3):
        for m, opt in ((model, ours), (twin, fresh)):
            opt.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_unknown_optimizer_keywords_are_refused_with_the_accepted_list():
    spec = parse_job(job(optimizer='name = "adamw"\nlr = 0.01\nmomentum = 0.9'), "test").optimizer
    with pytest.raises(ConfigError, match=r"AdamW takes no momentum; it accepts .*betas.*weight_decay"):
        build_optimizer([nn.Parameter(torch.zeros(2))], spec)
    spec = parse_job(job(optimizer='name = "adamx"\nlr = 0.01'), "test").optimizer
    with pytest.raises(ConfigError, match=r"torch.optim has no such optimizer; one of .*adamw"):
        build_optimizer([nn.Parameter(torch.zeros(2))], spec)


def test_make_optimizer_in_the_job_module(tmp_path):
    name = module(tmp_path, "make_optimizer = adamw_with_groups\n")
    t = trainer(job(module=name), spec_dir=str(tmp_path))
    assert isinstance(t.optimizer, torch.optim.AdamW) and t.optimizer.param_groups[0]["weight_decay"] == 0.1
    bad = module(tmp_path, "def make_optimizer(params, spec):\n    return 'sgd'\n", "bad_opt")
    with pytest.raises(ConfigError, match=r"bad_opt.make_optimizer\(\) returned str; expected a torch.optim"):
        trainer(job(module=bad), spec_dir=str(tmp_path))


def test_init_state_is_idempotent_and_keeps_parameters():
    model = nn.Linear(3, 3)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.5)
    init_state(opt)
    init_state(opt)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in opt.state.values())


def test_a_job_with_dict_batches_its_own_loss_metric_and_extra_scalars(tmp_path):
    name = module(tmp_path, """
        make_model = make_regression_model
        make_datasets = make_dict_datasets
        loss = regression_loss
        evaluate = regression_evaluate
    """)
    t = trainer(job(module=name, metric="val_loss", epochs=8), spec_dir=str(tmp_path))
    assert t.spec.metric_mode == "min"
    first = t.evaluate()["val_loss"]
    while not t.done:
        t.step(MEMBERS)
    assert set(t.extras) == {"mae"}
    assert t.evaluate()["val_loss"] < 0.2 * first


@pytest.mark.parametrize("body, message", [
    ("loss = loss_returns_float\n", r"variant.loss\(\) returned float; expected a scalar tensor"),
    ("loss = loss_returns_vector\n", r"variant.loss\(\) returned \(2,\); expected a scalar tensor"),
    ("evaluate = evaluate_without_metric\n", r"returned \['something'\], without job.metric = 'accuracy'"),
    ("evaluate = evaluate_returns_list\n", r"variant.evaluate\(\) returned list; expected a dict"),
    ("make_model = not_a_model\n", r"variant.make_model\(\) returned str; expected a torch.nn.Module"),
    ("del make_datasets\n", r"the job module 'variant' has no make_datasets\(\)"),
    ("make_datasets = make_dict_datasets\n", r"peerd's default loss and evaluate take batches of \(inputs, targets\)"),
    ("loss = 3\n", r"variant.loss is int, expected a function"),
])
def test_a_job_module_that_returns_the_wrong_thing_fails_at_join(tmp_path, body, message):
    name = module(tmp_path, body)
    with pytest.raises(ConfigError, match=message):
        trainer(job(module=name), spec_dir=str(tmp_path))


def test_a_non_finite_loss_skips_the_step_but_not_the_count(tmp_path):
    name = module(tmp_path, "loss = nan_loss\n")
    t = trainer(job(module=name, optimizer='name = "sgd"\nlr = 0.1'), spec_dir=str(tmp_path))
    seen = []
    for _ in range(6):
        before = t.flat.vector.clone()
        loss = t.step(MEMBERS)
        seen.append((math.isnan(loss), torch.equal(before, t.flat.vector)))
    assert t.skipped_steps == 2 and t.step_count == 6
    assert sum(nan for nan, _ in seen) == 2
    assert all(unchanged for nan, unchanged in seen if nan)  # never applied
    assert all(math.isfinite(x) for x in t.flat.vector.tolist()) and math.isfinite(t.loss_ema)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_and_keeps_fp32_parameters(precision):
    t = trainer(job(train=f'precision = "{precision}"\ngrad_clip_norm = 1.0', epochs=10))
    first = t.evaluate()["loss"]
    while not t.done:
        t.step(MEMBERS)
    assert t.flat.vector.dtype == torch.float32
    assert t.evaluate()["loss"] < first
    if precision == "fp16":  # the scaler's state is part of the training state
        assert "scaler" in t.state.objects and t.state.objects["scaler"].get_scale() > 0


def test_gradient_clipping_bounds_the_update():
    clipped = trainer(job(optimizer='name = "sgd"\nlr = 1.0\nmomentum = 0.0', train="grad_clip_norm = 0.001"))
    before = clipped.flat.vector.clone()
    clipped.step(MEMBERS)
    assert float((clipped.flat.vector - before).norm()) <= 0.001 * 1.0001


def test_loader_workers_read_the_same_samples_and_train_the_same_model():
    """Two DataLoader worker processes change when samples are loaded, not which:
    the re-split and DBS guarantees hold unchanged."""
    plain = trainer(job(epochs=2, optimizer='name = "sgd"\nlr = 0.05'))
    loaded = trainer(job(epochs=2, optimizer='name = "sgd"\nlr = 0.05', data="loader_workers = 2"))
    try:
        reads = {0: [], 2: []}
        while not plain.done:
            plain.step(["a", "b"])
            reads[0].append(plain.last_indices)
        while not loaded.done:
            loaded.step(["a", "b"])
            reads[2].append(loaded.last_indices)
        assert reads[0] == reads[2] and sum(map(len, reads[0])) == 200  # half of 200 samples, 2 epochs
        assert torch.equal(plain.flat.vector, loaded.flat.vector)
    finally:
        loaded.close()


def test_the_model_file_is_a_plain_state_dict(tmp_path):
    t = trainer(job())
    t.step(MEMBERS)
    t.save(tmp_path / "model.pt", round=1, metrics={"accuracy": 0.5})
    plain = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    plain.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert torch.equal(plain[0].weight, t.model[0].weight.detach())
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["job"] == "real" and meta["step"] == 1 and meta["metrics"] == {"accuracy": 0.5}


@pytest.mark.parametrize("kind, expect", [("constant", [1.0] * 4), ("linear", [0.25, 0.5, 0.75, 0.75])])
def test_warmup_then_schedule(kind, expect):
    from peerd.core.schedule import schedule_factor

    assert [schedule_factor(kind, 0.0 if kind == "constant" else 0.25, s, 3 if kind == "linear" else 0)
            for s in range(4)] == pytest.approx(expect)


def test_peerds_loop_trains_in_the_modes_make_model_left_and_says_what_it_keeps(tmp_path, caplog):
    """docs/operations.md, "What peerd's own loop does to the model": a backbone
    the job module froze (eval mode, requires_grad False) stays as it was through
    the join check, the steps and the evaluations; the head trains. The log says
    what is kept and what peerd casts."""
    name = module(tmp_path, """
        def make_model():
            backbone = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16)).half()
            backbone.requires_grad_(False)
            backbone.eval()
            return nn.Sequential(backbone, nn.ReLU(), nn.Linear(16, 3))
    """, name="finetune")
    caplog.set_level(logging.INFO, logger="peerd.worker")
    t = trainer(job(module=name), spec_dir=str(tmp_path))
    backbone = {k: v.clone() for k, v in t.model[0].state_dict().items()}
    head = t.model[2].weight.detach().clone()
    for _ in range(4):
        t.step(MEMBERS)
    assert t.evaluate()["accuracy"] >= 0
    t.step(MEMBERS)
    assert [m.training for m in t.model.modules()] == [True, False, False, False, True, True]
    assert all(torch.equal(v, backbone[k]) for k, v in t.model[0].state_dict().items())
    assert not torch.equal(t.model[2].weight, head)
    assert f"{name}.make_model(): module(s) 0 in eval mode: trained in it, buffers kept as they are" in caplog.text
    assert f"{name}.make_model(): 4 parameter(s) with requires_grad=False: not trained, not averaged" in caplog.text
    assert f"{name}.make_model(): torch.float16 tensors cast to fp32" in caplog.text


def test_making_the_optimizers_state_is_no_step_a_script_sees():
    """docs/algorithms.md, "The training state": the zero-gradient step that makes
    the state is the torch class's own, so a script's optimizer subclass that
    notes its steps and its step hooks see none; the state is made all the same."""

    class Noting(torch.optim.AdamW):
        def __init__(self, params, **options) -> None:
            super().__init__(params, **options)
            self.steps = 0

        def step(self, closure=None):
            self.steps += 1
            return super().step(closure)

    param = nn.Parameter(torch.ones(4))
    optimizer = Noting([param], lr=0.1)
    hooked = []
    optimizer.register_step_pre_hook(lambda *args: hooked.append(args))
    init_state(optimizer)
    assert optimizer.steps == 0 and hooked == [] and torch.equal(param, torch.ones(4))
    assert set(optimizer.state[param]) == {"step", "exp_avg", "exp_avg_sq"} and int(optimizer.state[param]["step"]) == 0
    param.grad = torch.ones(4)
    optimizer.step()
    assert optimizer.steps == 1 and hooked  # (torch runs the hooks once per hooked class the step passes)
