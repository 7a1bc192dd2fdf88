"""The CUDA paths: training on a GPU, one worker per GPU, the training state
between CPU and GPU peers, checkpoints written on a GPU and read on a CPU,
bf16 autocast and the fp16 GradScaler, and the pinned-copy averaging round.

Tests marked `cuda` are skipped where torch sees no CUDA device (bench/gpu_check.py
runs them on a GPU machine: `pytest -m cuda tests/e2e/test_cuda.py`). Where a path can
be driven on the CPU too (the copy-in/copy-out round, GradScaler overflow, state
and checkpoint round trips), the same test runs with device "cpu", so the code is
exercised on every run and the GPU run only adds the device.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import example_job, wait_for
from peerd.core.workers import member_ids, worker_devices
from peerd.daemon.devices import local_gpus
from peerd.settings.jobspec import parse_job
from peerd.control.launch import Launch
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.engine import Engine
from peerd.worker.wire.stores import SegmentServer
from peerd.worker.state.pull import StateServer
from peerd.worker.train.trainer import Trainer, resolve_device
from peerd.worker.wire.transport import MemoryTransport

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")


def cuda_only(test):
    return pytest.mark.cuda(needs_cuda(test))


# "cpu" always; "cuda" where there is one (the same test, on the device).
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, needs_cuda])]

JOBCODE = str(Path(__file__).parents[1] / "jobcode")
MEMBERS = ["a"]


def job(train: str = "", optimizer: str = 'name = "adamw"\nlr = 0.01\nweight_decay = 0.05',
        module: str = "real_job", **keys) -> str:
    values = {"local_batch": 8, "epochs": 4, "epoch_chunks": 2, **keys}
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return (f'[job]\nname = "gpu"\nmodule = "{module}"\n{lines}[optimizer]\n{optimizer}\nschedule = "constant"\n'
            f"[train]\n{train}\n")


def trainer(text: str, device: str, peer: str = "a", spec_dir: str = JOBCODE) -> Trainer:
    return Trainer(parse_job(text, "test"), peer, spec_dir, device=device)


def on(t: Trainer) -> set[str]:
    """The device types every tensor of the training state lives on."""
    tensors = [*t.state.parts(), *t.model.buffers()]
    tensors += [v for s in t.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    return {x.device.type for x in tensors}


def train(t: Trainer, steps: int) -> None:
    for _ in range(steps):
        t.step([t.peer_id])


# --- training on cuda ---------------------------------------------------------------


@cuda_only
def test_a_trainer_on_cuda_keeps_the_whole_state_on_the_gpu_and_learns():
    t = trainer(job(epochs=10), "cuda")
    assert t.device.type == "cuda" and on(t) == {"cuda"}
    assert t.context().pin_memory == t.spec.data_loading.pin_memory  # pinned batches only to a GPU
    first = t.evaluate()["loss"]
    while not t.done:
        t.step(MEMBERS)
    assert on(t) == {"cuda"} and t.flat.vector.is_cuda and t.flat.vector.dtype == torch.float32
    assert t.skipped_steps == 0 and t.evaluate()["loss"] < first
    # The parameters are still views into the flat vector the rounds average.
    assert all(p.data_ptr() >= t.flat.vector.data_ptr() for p in t.state.params)


@cuda_only
def test_the_same_job_starts_from_the_same_model_on_cpu_and_gpu_and_steps_alike():
    """The model is built on the CPU with the job's seed, then moved: a GPU peer and
    a CPU peer of a shared-init job start equal, and one step differs by float
    rounding only."""
    sgd = 'name = "sgd"\nlr = 0.1\nmomentum = 0.9'  # Adam's first step is lr·sign(g): a near-zero g could flip
    cpu, gpu = trainer(job(optimizer=sgd), "cpu"), trainer(job(optimizer=sgd), "cuda")
    assert torch.equal(cpu.state.vector(), gpu.state.vector())
    cpu.step(MEMBERS)
    gpu.step(MEMBERS)
    torch.testing.assert_close(gpu.state.vector(), cpu.state.vector(), rtol=1e-3, atol=1e-5)


@cuda_only
def test_auto_takes_the_first_gpu_and_a_missing_index_is_a_config_error():
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(Exception, match=r"torch sees \d+ CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


# --- devices = "auto": one worker per GPU ------------------------------------------


@cuda_only
def test_devices_auto_gives_one_worker_per_gpu_each_training_on_its_own():
    """The daemon counts GPUs without torch (/proc/driver/nvidia or
    CUDA_VISIBLE_DEVICES); that count must be what torch sees in the worker."""
    gpus = local_gpus()
    assert gpus == torch.cuda.device_count()
    devices = worker_devices((), gpus)
    assert devices == tuple(f"cuda:{k}" for k in range(gpus))
    assert len(set(member_ids("p", len(devices)))) == len(devices)
    for k, device in enumerate(devices):
        t = trainer(job(epochs=1), device, peer=f"p.{k}")
        assert t.flat.vector.device == torch.device("cuda", k)
        train(t, 2)
        assert {x.device for x in t.state.parts()} == {torch.device("cuda", k)}


@cuda_only
@pytest.mark.e2e
def test_a_daemon_with_devices_auto_runs_one_worker_per_gpu(local_cluster):
    cluster = local_cluster(1, settings=lambda peer: {"worker": {"devices": "auto"}})
    peer = cluster.peers[0]
    text = example_job(job={"name": "gpus", "epochs": 1, "eval_every_rounds": 5}, checkpoint={"every_rounds": 5})
    cluster.client(peer).join(text)
    want = [f"cuda:{k}" for k in range(torch.cuda.device_count())]

    def workers():
        jobs = cluster.client(peer).status().jobs
        return sorted((w.device, w.state) for w in jobs[0].workers) if jobs else []

    wait_for(lambda: [d for d, _ in workers()] == want, 60, f"one worker per GPU: {want}")

    def finished():
        got = workers()
        assert all(state != "failed" for _, state in got), got
        return got and all(state == "finished" for _, state in got)

    wait_for(finished, 240, "every GPU worker to finish")


# --- the training state between a CPU peer and a GPU peer --------------------------


def fake_worker(t: Trainer, tmp_path: Path) -> Engine:
    """A real worker's engine without a daemon: its exchange pieces are served in memory."""
    engine = Engine(t, types.SimpleNamespace(), Launch(t.spec, "", "", t.peer_id, out_dir=tmp_path / t.peer_id))
    engine.trainer = t  # the tests reach the training side through it
    return engine


def wire_in_memory(workers: list[Engine]) -> dict[str, str]:
    segments = {f"mem-{w.me}": SegmentServer(w.identity, w.store, len(w.rounds.layout), 1000, w.rounds.stages)
                for w in workers}
    states = {f"mem-{w.me}": StateServer(w.identity, w.board, w.store, 1000) for w in workers}
    for w in workers:
        w.grpc_transport = w.transport  # never opened; closed at the end
        w.transport = w.rounds.transport = MemoryTransport(w.identity, segments, states)
    return {w.me: f"mem-{w.me}" for w in workers}


async def close(workers: list[Engine]) -> None:
    for w in workers:
        await w.grpc_transport.aclose()


async def donate_when_asked(donor: Engine) -> None:
    """The donor's round loop at a round boundary: capture when a newcomer asks."""
    while not donor.board.wanted:
        await asyncio.sleep(0.01)
    await donor.board.capture(donor.trainer.state.parts(), donor._meta())


@pytest.mark.parametrize("there, back", [("cpu", "cpu"), pytest.param("cpu", "cuda", marks=[pytest.mark.cuda, needs_cuda]),
                                         pytest.param("cuda", "cpu", marks=[pytest.mark.cuda, needs_cuda])])
async def test_the_whole_state_goes_from_one_device_to_the_other_and_back(tmp_path, there, back):
    """Through the real worker's state path (StateBoard.capture of the parts where
    they live, StateServer, pull_state, Trainer.adopt_state): a newcomer on the
    other device takes the donor's state bit for bit (AdamW moments, BatchNorm
    statistics, step), and then gives it back the same way."""
    first = fake_worker(trainer(job(), there, "a"), tmp_path)
    train(first.trainer, 5)
    first.rounds.round = 3  # as its rounds would have counted
    second = fake_worker(trainer(job(), back, "b"), tmp_path)
    addresses = wire_in_memory([first, second])
    try:
        for donor, newcomer in ((first, second), (second, first)):
            await donor.store.publish(donor.round, donor.trainer.flat.vector)
            task = asyncio.create_task(donate_when_asked(donor))
            taken = await newcomer.join.take_state({donor.me: addresses[donor.me]}, "test")
            await task
            assert taken == donor.round
            newcomer.rounds.round = taken  # what Engine.start applies
            assert newcomer.round == donor.round and newcomer.trainer.step_count == donor.trainer.step_count
            assert torch.equal(newcomer.trainer.state.vector(), donor.trainer.state.vector())
            assert on(newcomer.trainer) == {newcomer.trainer.device.type}  # adopted in place, on its own device
            steps = donor.trainer.step_count
            assert int(newcomer.trainer.model[1].num_batches_tracked) == steps
            assert {float(s["step"]) for s in newcomer.trainer.optimizer.state.values()} == {float(steps)}
            if donor is first:
                train(second.trainer, 3)  # then the state goes back, 3 steps further
                second.rounds.round = 4
        assert first.trainer.step_count == 8
    finally:
        await close([first, second])


# --- checkpoints written on a GPU, read on a CPU ------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_and_model_file_from_a_trainer_load_on_a_machine_without_a_gpu(tmp_path, device):
    t = trainer(job(train='precision = "fp16"' if device == "cuda" else ""), device)
    train(t, 4)
    ckpts = CheckpointDir(tmp_path / "ckpt", "gpu", "fp", t.state.numel)
    from peerd.worker.state.pull import StateMeta

    ckpts.save(StateMeta(2, t.step_count, t.progress, t.state.extra()), t.state.vector())
    t.save(tmp_path / "model.pt", round=2)
    # A process that cannot see any GPU loads both, and continues from the checkpoint.
    script = f"""
import sys, torch
sys.path.insert(0, {JOBCODE!r})
assert not torch.cuda.is_available()
from peerd.settings.jobspec import parse_job
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.train.trainer import Trainer
text = {job(train='precision = "fp16"' if device == "cuda" else "")!r}
t = Trainer(parse_job(text, "t"), "c", {JOBCODE!r}, device="cpu")
c = CheckpointDir(__import__("pathlib").Path({str(tmp_path / "ckpt")!r}), "gpu", "fp", t.state.numel).load_newest()
t.adopt_state(c.vector, c.meta.extra, c.meta.step, c.meta.progress)
torch.save(t.state.vector(), {str(tmp_path / "adopted.pt")!r})
state = torch.load({str(tmp_path / "model.pt")!r}, weights_only=True)
assert all(v.device.type == "cpu" for v in state.values())
import real_job
m = real_job.make_model(); m.load_state_dict(state)
t.step(["c"])
print("ok", t.step_count)
"""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "5"]
    assert torch.equal(torch.load(tmp_path / "adopted.pt"), t.state.vector())


# --- precision: bf16 autocast, fp16 with a GradScaler ------------------------------

RECORDING = """
import sys
sys.path.insert(0, {jobcode!r})
from real_job import *  # noqa
import torch
from torch import nn

SEEN = []
BLOW_UP = {{"at": 0}}  # the call whose loss is made huge (0: none)


def loss(model, batch):
    out = model(batch[0])
    SEEN.append(out.dtype)
    value = nn.functional.cross_entropy(out, batch[1])
    # Finite in fp32, but its scaled gradients overflow fp16: the scaler must skip the step.
    return value * 1e30 if len(SEEN) == BLOW_UP["at"] else value
"""


def recording_job(tmp_path: Path, name: str) -> str:
    sys.modules.pop(name, None)
    (tmp_path / f"{name}.py").write_text(RECORDING.format(jobcode=JOBCODE))
    return name


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_runs_under_autocast_and_keeps_fp32_parameters(tmp_path, device):
    name = recording_job(tmp_path, f"bf16_{device}")
    t = trainer(job(train='precision = "bf16"\ngrad_clip_norm = 1.0', module=name, epochs=3), device,
                spec_dir=str(tmp_path))
    assert t.precision.scaler is None  # bf16 needs no scaler
    first = t.evaluate()["loss"]
    while not t.done:
        t.step(MEMBERS)
    seen = sys.modules[name].SEEN
    assert seen and set(seen) == {torch.bfloat16}  # every training forward ran in bf16
    assert t.flat.vector.dtype == torch.float32 and t.flat.vector.device.type == device
    assert t.skipped_steps == 0 and t.evaluate()["loss"] < first


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_overflow_is_skipped_by_the_gradscaler_and_its_scale_travels(tmp_path, device):
    """Step 3's gradients overflow fp16: the scaler skips it (parameters as they
    were, counted), halves its scale, and the scale goes to a newcomer with the
    rest of the state."""
    name = recording_job(tmp_path, f"fp16_{device}")
    t = trainer(job(train='precision = "fp16"', module=name), device, spec_dir=str(tmp_path))
    code = sys.modules[name]
    code.BLOW_UP["at"] = len(code.SEEN) + 3  # one micro-batch per step: the third step's loss
    scaler = t.precision.scaler
    assert scaler is not None and scaler.is_enabled() and t.state.objects["scaler"] is scaler
    scales, unchanged = [], []
    for _ in range(4):
        before = t.flat.vector.clone()
        loss = t.step(MEMBERS)
        assert math.isfinite(loss)
        scales.append(scaler.get_scale())
        unchanged.append(torch.equal(before, t.flat.vector))
    assert unchanged == [False, False, True, False]
    assert t.skipped_steps == 1 and t.step_count == 4
    assert scales[2] == scales[1] * scaler.get_backoff_factor()
    assert set(sys.modules[name].SEEN) == {torch.float16}
    other = trainer(job(train='precision = "fp16"', module=name), "cpu", "b", spec_dir=str(tmp_path))
    other.adopt_state(t.state.vector(), t.state.extra(), t.step_count, t.progress)
    assert other.precision.scaler.get_scale() == scaler.get_scale()


# --- the pinned-copy averaging path ---------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
async def test_a_round_of_a_model_off_the_cpu_averages_in_a_host_copy(tmp_path, device):
    """Rounds.work: a model on a GPU is copied into a pinned host buffer, averaged
    there with the partners' segments, and copied back (non-blocking) into the
    device vector the parameters view. On the CPU the same path is forced by giving
    the worker a work buffer, so it runs on every machine."""
    a = fake_worker(trainer(job(), device, "a"), tmp_path)
    b = fake_worker(trainer(job(), "cpu", "b"), tmp_path)
    if device == "cpu":
        a.rounds.work = torch.empty(a.trainer.state.gossiped)
    else:
        assert a.rounds.work is not None and a.rounds.work.is_pinned() and not a.rounds.work.is_cuda
    assert b.rounds.work is None  # a CPU model: the round works on its vector itself
    train(a.trainer, 2)
    train(b.trainer, 3)
    mean = (a.trainer.state.vector()[: a.trainer.state.gossiped] + b.trainer.flat.vector) / 2
    view = wire_in_memory([a, b])
    params = a.trainer.state.params[0]
    try:
        for w in (a, b):
            w.rounds.round += 1  # the engine's round is its rounds' count
        intos = [await w.rounds._publish() for w in (a, b)]
        assert intos[0] is None and intos[1] is not None
        results = await asyncio.gather(a.rounds._round(view, intos[0]), b.rounds._round(view, intos[1]))
        assert all(r is not None and r.misses == 0 for r in results)
        if device == "cuda":
            torch.cuda.synchronize()
        assert a.trainer.flat.vector.device.type == device
        torch.testing.assert_close(a.trainer.flat.vector.cpu(), mean)
        torch.testing.assert_close(b.trainer.flat.vector, mean)
        # The parameters see the averaged values: they are views into the device vector.
        first = params.numel()
        torch.testing.assert_close(params.detach().reshape(-1).cpu(), mean[:first])
        a.trainer.step(MEMBERS)  # and training goes on from them on the device
        assert a.trainer.flat.vector.device.type == device
    finally:
        await close([a, b])
