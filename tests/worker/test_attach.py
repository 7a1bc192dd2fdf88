"""peerd.attach's pieces that need no daemon: the script's evaluate() wrapper;
a script's loaders, epochs, schedule length, loss and LR law; its working
directory."""

from __future__ import annotations

import logging
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import peerd
from peerd.core.health import NONFINITE
from peerd.core.lifecycle import Event, Stage
from peerd.core.shares import BatchPlan
from peerd.core.stepplan import StepPlan
from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.control.launch import Launch, set_launch
from peerd.peer import Peer, _loss_value, _script_evaluation
from peerd.worker.engine import NO_STEP_PHASE, Engine
from peerd.worker.train.scriptschedule import ScriptScheduler, check_scheduler
from peerd.worker.train.scriptsource import ScriptSource
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.main import run_script
from peerd.worker.state.trainstate import TrainState


def test_the_scripts_evaluate_runs_without_gradients_and_keeps_the_models_mode():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    seen = {}

    def evaluate():
        model.eval()  # as scripts do, without switching back
        seen["grad"] = torch.is_grad_enabled()
        return {"val_loss": torch.tensor(1.5), "accuracy": 1}

    model.train()
    assert _script_evaluation(model, evaluate)() == {"val_loss": 1.5, "accuracy": 1.0}
    assert model.training and seen["grad"] is False
    model.eval()
    _script_evaluation(model, evaluate)()
    assert not model.training


def test_the_scripts_evaluate_gives_back_each_modules_own_mode():
    """Fine-tuning: a frozen backbone's BatchNorm in eval mode under a model in
    train mode stays so after peerd's evaluation, or its statistics would drift."""
    backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    model = nn.Sequential(backbone, nn.Linear(4, 2), nn.Dropout(0.1))
    model.train()
    backbone.eval()
    before = [m.training for m in model.modules()]

    def evaluate():
        model.eval()
        return {"accuracy": 1.0}

    _script_evaluation(model, evaluate)()
    assert [m.training for m in model.modules()] == before
    assert model.training and not backbone.training and not backbone[1].training and model[2].training


@pytest.mark.parametrize("result", [None, 0.5, {"accuracy": "high"}, [("a", 1, 2)]])
def test_an_evaluate_that_returns_no_dict_of_numbers_is_named(result):
    with pytest.raises(ConfigError, match=r"evaluate\(\) must return a dict of numbers"):
        _script_evaluation(nn.Linear(1, 1), lambda: result)()


def test_the_mode_comes_back_when_evaluate_raises():
    model = nn.Linear(1, 1)

    def evaluate():
        model.eval()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        _script_evaluation(model, evaluate)()
    assert model.training


# --- a script's epochs, schedule, loss and LR law, on a Peer without its engine -----------------

def script_peer(epochs: float = 2, local_batch: int = 8, members: tuple[str, ...] = ("a",), me: str = "a",
                reference_batch: int = 0, scheduler=None, interval: str = "step") -> Peer:
    """A script's Peer as attach() makes it, without the engine: loader(), the
    counters, _advance_scheduler and _update_lr work; step() does not."""
    spec = parse_job(textwrap.dedent(f"""
        [job]
        name = "unit"
        script = "train.py"
        epochs = {epochs}
        local_batch = {local_batch}
        epoch_chunks = 4
        [optimizer]
        reference_batch = {reference_batch}
        ramp_steps = 8
    """), "unit.toml")
    model = nn.Sequential(nn.Linear(1, 2), nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if callable(scheduler):
        scheduler = scheduler(optimizer)
    state = TrainState(model, optimizer, objects={"scheduler": scheduler} if scheduler is not None else {})
    lr = LrControl(spec.optimizer)
    lr.install(optimizer)
    peer = Peer.__new__(Peer)
    peer.launch = Launch(spec, "", "unix:/nonexistent", me)
    peer.spec, peer.source, peer.state = spec, ScriptSource(state, spec, me, lr), state
    peer._script, peer._left, peer._steps = True, False, 0
    peer._plan = StepPlan(list(members), len(members), None)
    peer._engine = bare_engine()
    lr.before_step = peer._before_optimizer_step  # as attach() wires it
    if scheduler is not None:
        peer.source.schedule = ScriptScheduler(scheduler, interval, spec.epochs)
    return peer


def bare_engine(watch_health=lambda metrics: None) -> Engine:
    """An engine, training, with only what Peer.step and Peer.report reach of it."""
    engine = Engine.__new__(Engine)
    engine.stage, engine._waiting_for, engine.metrics = Stage.TRAINING, "", {}
    engine.watch_health = watch_health
    return engine


def counted_step(peer: Peer, loss=None, own_scheduler_step: bool = False) -> None:
    """A script's step (optimizer.step(), maybe its own scheduler.step()), then
    what peer.step() does for it but the gossip round."""
    peer.state.optimizer.step()
    if own_scheduler_step:
        peer.state.objects["scheduler"].step()  # raises past a OneCycleLR's end
    peer.source.record(None, _loss_value(loss), 0.0)
    peer._count_step()
    peer._advance_scheduler()
    peer._update_lr()


def samples(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1))


@pytest.mark.parametrize("n, batch, epochs, members", [
    (1000, 48, 3, 1),    # alone: the job's short last batch is a step of its own
    (1000, 50, 3, 1),    # the batch divides the data set
    (1000, 48, 2.5, 1),  # fractional epochs
    (1000, 32, 3, 3),    # three peers in step
    (999, 7, 2, 2),
])
def test_a_onecycle_as_long_as_total_steps_is_never_stepped_past_its_end(n, batch, epochs, members):
    ids = [f"p{i}" for i in range(members)]
    total = peerd.total_steps(n, batch, epochs=epochs)
    peers = [script_peer(epochs, batch, tuple(ids), me, scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=total)) for me in ids]
    assert peers[0].total_steps(n, batch) == total
    batches = [iter(p.loader(samples(n), batch_size=batch)) for p in peers]
    steps = dict.fromkeys(ids, 0)
    while batches:  # the peers step in turn, as they do in rounds, each its own script
        for peer, it in list(zip(peers, batches)):
            if next(it, None) is None:
                peers.remove(peer), batches.remove(it)
                continue
            counted_step(peer, own_scheduler_step=True)
            steps[peer.peer_id] += 1
    if members == 1:
        assert steps["p0"] == total  # alone, one process's steps, the short last one included
    assert peerd.total_steps(n, batch, epochs=epochs) >= int(epochs * n / batch)


def test_a_schedule_of_epochs_times_the_full_batches_overflows_alone():
    """Why total_steps counts the short last batch: the usual EPOCHS * len // BATCH
    is a step short for a process alone (OneCycleLR raises)."""
    peer = script_peer(3, 48, scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=3 * 1000 // 48))
    with pytest.raises(ValueError, match="Tried to step"):
        for _ in peer.loader(samples(1000), batch_size=48):
            counted_step(peer, own_scheduler_step=True)


@pytest.mark.parametrize("scheduler, interval, expect", [
    (lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3), None, r'scheduler_interval="step" .* or "epoch"'),
    (lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3), "batch", r"got 'batch'"),
    (lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "epoch", r"state=\{\"reducelronplateau\""),
])
def test_a_scheduler_is_refused_at_attach_without_a_unit_peerd_can_follow(scheduler, interval, expect):
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=expect):
        check_scheduler(scheduler(optimizer), interval)


def test_a_per_step_scheduler_the_script_never_steps_stops_it_before_the_lr_moves():
    """A per-epoch StepLR(step_size=3) declared "step": stepped by peerd at every
    local step it would divide the LR by 10 every 3 steps (1e-283 at the end)."""
    peer = script_peer(3, 10, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.1))
    with pytest.raises(ConfigError, match='does not call scheduler.step\\(\\) .* scheduler_interval="epoch"'):
        for _ in peer.loader(samples(100), batch_size=10):
            counted_step(peer)
    assert peer.state.objects["scheduler"].last_epoch == 0
    assert peer.state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_a_per_epoch_scheduler_the_script_steps_every_batch_is_stopped():
    peer = script_peer(3, 10, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.1),
                       interval="epoch")
    with pytest.raises(ConfigError, match='calls scheduler.step\\(\\) between its steps.* scheduler_interval="step"'):
        for _ in peer.loader(samples(100), batch_size=10):
            counted_step(peer, own_scheduler_step=True)


@pytest.mark.parametrize("members", [("a",), ("a", "b", "c")])
def test_a_per_epoch_scheduler_follows_the_jobs_epochs_whatever_the_peers(members):
    """StepLR(step_size=2, gamma=0.1) stepped after each epoch, as the script does
    alone: each batch trains at 0.1 × 0.1^(job epoch // 2), with one peer or three."""
    peer = script_peer(6, 10, members=members, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(
        opt, 2, gamma=0.1), interval="epoch")
    seen = set()
    for _ in peer.loader(samples(100), batch_size=10):
        epoch = peer.epoch
        assert peer.state.objects["scheduler"].last_epoch == epoch
        assert peer.state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1 ** (epoch // 2))
        seen.add(epoch)
        counted_step(peer)
    assert seen == set(range(6))
    assert peer.state.objects["scheduler"].last_epoch <= 6


def test_after_the_jobs_end_a_loader_yields_nothing_and_a_second_loader_goes_on_where_the_first_stopped():
    peer = script_peer(epochs=2, local_batch=8)
    data = samples(100)
    read, epochs = [], []
    for i, (x,) in enumerate(peer.loader(data)):  # a script that breaks out of its loader mid-job
        epochs.append(peer.epoch)
        read += x.flatten().int().tolist()
        counted_step(peer)
        if i == 9:
            break
    for passes in range(5):  # ... and keeps its epoch loop around a new loader
        for (x,) in peer.loader(data):
            epochs.append(peer.epoch)
            read += x.flatten().int().tolist()
            counted_step(peer)
    # Every sample twice (the job's 2 epochs), none more: the later passes got no batch.
    assert sorted(read) == sorted(list(range(100)) * 2)
    assert peer.done and peer.should_stop and peer.progress == 2.0
    # A batch runs on across the epoch's end: it is of the epoch it ends in.
    assert epochs == [0] * 12 + [1] * 13 and peer.epoch == 1  # never the end (2) itself
    assert len(peer.loader(data)) == 0 and list(peer.loader(data)) == []


def test_a_loader_made_after_taking_the_jobs_state_starts_at_its_position():
    peer = script_peer(epochs=3, local_batch=10)
    state = peer.state
    peer.source.adopt_state(state.vector(), state.extra(), 40, 1.5)  # what attach() does for a joiner
    assert peer.epoch == 1
    seen = []
    for (x,) in peer.loader(samples(100)):
        seen.append(peer.epoch)
        counted_step(peer)
    # The rest of epoch 1 (from its next chunk: half of it) and epoch 2; nothing of epoch 0 again.
    assert seen == [1] * 5 + [2] * 10 and peer.progress == 3.0


def test_a_job_done_before_the_first_loader_gives_an_empty_one():
    """A worker restarted after the others finished takes the end as its position."""
    peer = script_peer(epochs=2)
    peer.source.adopt_state(peer.state.vector(), peer.state.extra(), 30, 2.0)
    assert list(peer.loader(samples(50))) == [] and peer.epoch == 1


def test_a_first_step_after_the_no_step_warning_puts_the_phase_back():
    """A slow first step (long data preparation) must not leave the worker in a
    phase where SIGTERM stops it at once, without its end-of-round checkpoint."""
    peer = script_peer()
    peer._engine.wait_for_first_step(True)  # what the watch does after first_step_warning_s without a step
    assert peer._engine.phase == NO_STEP_PHASE
    counted_step(peer)
    assert peer._engine.phase == "training"
    peer._engine.show_waiting("syncing")  # what else it shows is the engine's own
    counted_step(peer)
    assert peer._engine.phase == "syncing"


def test_the_no_step_warning_is_shown_while_training_only():
    """A worker that joined a job already ended trains nothing: its phase says
    it takes the job's model, not that it waits for a step."""
    engine = bare_engine()
    engine.stage = Stage.TAKING
    engine.wait_for_first_step(True)
    assert engine.phase == "taking the job's model"
    engine.on(Event.TAKEN)
    assert engine.phase == "finished"


def test_peer_step_takes_the_loss_tensor_without_a_warning():
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _loss_value(loss) == 6.0
        assert _loss_value(torch.tensor([0.5])) == 0.5
        assert _loss_value(1) == 1.0 and _loss_value(None) is None
    with pytest.raises(ConfigError, match="one-element tensor"):
        _loss_value(torch.ones(2))
    with pytest.raises(ConfigError, match="a number or a one-element tensor"):
        _loss_value("low")


def test_a_scripts_losses_and_reports_go_to_the_collapse_watch():
    """peer.step(loss=...) gives the watch each step's loss (a step without one, nothing);
    peer.report gives the engine's watch each evaluation (docs/algorithms.md, "When
    training collapses")."""
    peer = script_peer()
    for _ in range(5):
        counted_step(peer)
    counted_step(peer, loss=float("nan"))
    counted_step(peer)  # no loss: the non-finite ones still count as in a row
    assert peer.source.health.collapse is None
    counted_step(peer, loss=torch.tensor(float("inf")))
    counted_step(peer, loss=float("nan"))
    assert peer.source.health.collapse.rule == NONFINITE and peer.source.health.collapse.step == 9
    seen = []
    peer._engine = bare_engine(watch_health=seen.append)
    peer.report({"accuracy": 0.5})
    assert seen == [{"accuracy": 0.5}] and peer._engine.metrics == {"accuracy": 0.5}


def test_the_lr_law_sees_the_planned_global_batch_not_a_short_step(caplog):
    """3 trainers × the loader's 8: 24, also for the job's short last batch."""
    peer = script_peer(epochs=2, local_batch=4, members=("a", "b", "c"), reference_batch=12)
    caplog.set_level(logging.INFO, logger="peerd.worker")
    sizes = []
    for (x,) in peer.loader(samples(64), batch_size=8):  # made before any step: no ramp from 4 × 3
        sizes.append(len(x))
        counted_step(peer)
        assert peer.source.lr_control.ramp.batch == 24
    assert sizes[-1] < 8 == sizes[0]  # the short one was there
    assert "global batch now" not in caplog.text
    ramp = peer.source.lr_control.ramp
    assert ramp.scale(0) == ramp.target(24)


def accumulating_steps(peer: Peer, data: TensorDataset, micro: int, count: int, batch_size: int | None = None,
                       loader_options: dict | None = None) -> list[float]:
    """A script that accumulates: `micro` samples from the loader, optimizer.step()
    every `count` of them, then peer.step(batch_size=...) (all but the gossip
    round); returns the LR each optimizer step used, read inside the step."""
    used = []
    peer.state.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    for k, _ in enumerate(peer.loader(data, batch_size=micro, **(loader_options or {})), 1):
        if k % count:
            continue  # the script's backward() on a micro-batch
        peer.state.optimizer.step()
        changed = peer.source.record(batch_size, None, 0.0)
        peer._count_step()
        peer._advance_scheduler()
        peer._update_lr(fresh=peer._steps == 1 and changed)  # what peer.step() does but its round
    return used


@pytest.mark.parametrize("batch_size, options", [(32, None), (None, None), (32, {"num_workers": 1})])
def test_with_accumulation_the_lr_law_counts_the_samples_of_an_optimizer_step(caplog, batch_size, options):
    """Micro-batches of 8 from the loader, optimizer.step() every 4 and
    peer.step(batch_size=32), or peer.step() with the loader's batches of the
    step counted for it: 3 trainers × 32 is the reference 96, so the script's
    LR is used as it is from the first step on. The optimizer's first step sees
    the 4 batches the script took (not those a loader worker read ahead); the
    log says the law in force at that step, once, not the loader's 8 × 3."""
    peer = script_peer(epochs=2, local_batch=8, members=("a", "b", "c"), reference_batch=96)
    caplog.set_level(logging.INFO, logger="peerd.worker")
    used = accumulating_steps(peer, samples(384), 8, 4, batch_size, options)
    assert peer.source.lr_control.ramp.batch == 96 and peer.source.accumulation == 4
    assert len(used) == 8 and used == [pytest.approx(0.1)] * 8
    assert peer.source.samples == 8 * 32 and peer.source.counted == peer.source.received == 32
    assert [r.getMessage() for r in caplog.records] == [
        "LR: sqrt law against the reference batch 96, cap 2; global batch 96: LR scale 1.000"]


def test_with_dbs_the_plan_sizes_the_loaders_batch_and_a_step_accumulates_count_of_them(caplog):
    """docs/operations.md, "Script jobs": DBS plans the loader's batches (12 for
    this faster peer, 4 for the other: Σ 16); the script's step takes 4 of them,
    so its step is 48 samples, the global batch the law sees 4 × 16 = 64 and its
    LR the law's √2 (reference 32) times its DBS share 12 / 8."""
    peer = script_peer(epochs=2, members=("a", "b"), reference_batch=32)
    peer._plan = StepPlan(["a", "b"], 2, BatchPlan((("a", 12), ("b", 4))))
    caplog.set_level(logging.INFO, logger="peerd.worker")
    sizes = []
    peer.state.optimizer.register_step_pre_hook(lambda opt, args, kwargs: sizes.append(peer.source.accumulation))
    used = accumulating_steps(peer, samples(960), 8, 4)
    assert peer.source.lr_control.ramp.batch == 64 and sizes == [4] * len(used) and len(used) >= 8
    assert used == [pytest.approx(0.1 * 2 ** 0.5 * 1.5)] * len(used)
    assert peer.source.samples == 48 * len(used) and peer.source.local_batch == 48
    assert "global batch 64: LR scale 1.414" in caplog.text and "global batch now" not in caplog.text


def test_an_accumulating_scripts_step_schedule_counts_its_optimizer_steps():
    """A "step" schedule written alone for batches of 32 (8 × 4) follows the job
    at that rate: 2 peers, each step moves it 2 steps, and it ends at
    total_steps(dataset, 32), not 4× further."""
    total = peerd.total_steps(384, 32, epochs=2)
    peer = script_peer(epochs=2, members=("a", "b"), scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: 1.0), interval="step")
    scheduler = peer.state.objects["scheduler"]
    positions = []
    peer.state.optimizer.register_step_post_hook(lambda opt, args, kwargs: scheduler.step())  # the script's own
    peer.state.optimizer.register_step_post_hook(lambda opt, args, kwargs: positions.append(scheduler.last_epoch))
    accumulating_steps(peer, samples(384), 8, 4, 32)
    assert peer.source.steps_per_epoch == 384 / 32 and peer.source.total_steps == total == 24
    assert scheduler.last_epoch == total and positions == list(range(1, 2 * len(positions), 2))


def test_a_script_runs_in_its_workers_directory_with_its_own_paths(tmp_path, monkeypatch):
    """Relative writes land in the worker's directory (--out-dir); the script's
    own directory stays importable; relative paths given to the worker still hold."""
    jobdir, started = tmp_path / "job", tmp_path / "daemon"
    jobdir.mkdir(), started.mkdir()
    (jobdir / "helper.py").write_text("VALUE = 7\n")
    (jobdir / "train.py").write_text(textwrap.dedent("""
        import os, helper
        with open("written.txt", "w") as f:
            f.write(f"{os.getcwd()}|{__file__}|{helper.VALUE}")
    """))
    spec = parse_job('[job]\nname = "cwd"\nscript = "train.py"\n', "cwd.toml")
    monkeypatch.chdir(started)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    launch = Launch(spec, "../job", "unix:/nonexistent", "a", out_dir=Path("state/jobs/cwd"))
    try:
        with pytest.raises(ConfigError, match="ended without calling peerd.attach"):
            run_script(launch)
    finally:
        set_launch(None)
    out = started / "state" / "jobs" / "cwd"
    cwd, file, value = (out / "written.txt").read_text().split("|")
    assert Path(cwd) == out.resolve() and Path(file) == (jobdir / "train.py").resolve() and value == "7"
    assert not (started / "written.txt").exists()
