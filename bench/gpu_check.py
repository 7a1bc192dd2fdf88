#!/usr/bin/env python
"""One prepared check of a GPU machine (≤ 5 minutes on one GPU), with one summary.

  tests     the CUDA tests: `pytest -m cuda tests/e2e/test_cuda.py` (training on cuda,
            devices = "auto", state CPU<->GPU, a GPU checkpoint read on a CPU, bf16,
            fp16 GradScaler, the pinned-copy round, a daemon with one worker per GPU)
  cluster   a 2-peer local cluster of real daemons (peerd.cli.localcluster.LocalCluster):
            peer-0 trains on cuda, peer-1 on the CPU, one epoch of the MNIST example
  train     training throughput on the device: the MNIST example through the real
            Trainer (fp32, bf16), and a 64 MiB MLP (fp32, bf16) step by step
  exchange  exchange-and-average of a 64 MiB model between 2 worker processes over
            127.0.0.1 (bench/exchange.py, method peerd-copy: the path a GPU model
            takes), plus the GPU -> pinned host -> GPU copies a GPU worker adds per round
  nvml      [availability] mode = "when-free" on the real NVML (nvidia-ml-py): the
            daemon's GpuSampler sees an owner's process (a child that holds 256 MiB
            on cuda:0) and no longer sees it once it ends; the seconds each took

Where torch sees no CUDA device it says so, runs the CPU parts that make sense (the
CPU variants of the same tests, the cluster with both peers on the CPU, throughput
and exchange on the CPU) and exits 0 when they pass. Exit 1: a part failed.

    .venv/bin/python bench/gpu_check.py
    .venv/bin/python bench/gpu_check.py --skip cluster,tests --out /tmp/gpu-check
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT
from harness.cluster import job_status, join_all, poll_until, wait_discovery
from harness.script import arg_parser, run_main

PARTS = ("tests", "cluster", "train", "exchange", "nvml")
MIB = 64


@dataclass
class Part:
    name: str
    ok: bool | None = None  # None: skipped
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0


def device_info() -> tuple[str, list[str]]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", [f"no GPU found: torch {torch.__version__} sees no CUDA device "
                       f"(CUDA build: {torch.version.cuda or 'none'}); running the CPU parts"]
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)"]
    for k in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(k)
        lines.append(f"cuda:{k} {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}, "
                     f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}")
    return "cuda", lines


# --- the parts ---------------------------------------------------------------------------


def run_tests(device: str, budget_s: float) -> Part:
    """The CUDA tests on a GPU; the CPU variants of the same tests without one."""
    part = Part("tests")
    select = "cuda" if device == "cuda" else "not cuda"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", select, "tests/e2e/test_cuda.py"]
    part.lines.append("$ " + " ".join(["pytest", "-m", repr(select), "tests/e2e/test_cuda.py"]))
    try:
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        part.ok = False
        part.lines.append(f"timed out after {budget_s:.0f} s")
        return part
    tail = [line for line in run.stdout.splitlines() if line.strip()]
    part.lines.append(tail[-1] if tail else "(no output)")
    if run.returncode != 0:
        part.lines += [line for line in tail if line.startswith(("FAILED", "ERROR"))][:10]
    part.ok = run.returncode == 0
    return part


def run_cluster(device: str, budget_s: float, out: Path) -> Part:
    """Two real daemons on 127.0.0.1: peer-0 on cuda (when there is one), peer-1 on the CPU."""
    from peerd.cli.localcluster import LocalCluster, default_job, job_with
    from peerd.errors import PeerdError

    part = Part("cluster")
    devices = {0: device, 1: "cpu"}
    text = job_with(default_job(), job={"name": "gpu-check", "epochs": 1, "eval_every_rounds": 20})
    try:
        with LocalCluster(2, out / "cluster", settings=lambda peer: {"worker": {"device": devices[peer.index]}}) as c:
            c.wait_ready()
            wait_discovery(c, 30)
            join_all(c, text)
            ws = _trained(c, budget_s)
    except (PeerdError, OSError, TimeoutError) as exc:
        part.ok = False
        part.lines.append(f"{type(exc).__name__}: {exc} (logs under {out / 'cluster'})")
        return part
    for w in ws:
        p = w.progress
        part.lines.append(f"{w.member}: {w.device:<6} {w.state:<9} accuracy {p.metric:.3f}, {p.samples_per_s:.0f} "
                          f"samples/s, {p.round} rounds, partners {p.partners_reached}/{p.partners_planned}")
    part.ok = len(ws) == 2 and all(w.state == "finished" and w.progress.metric > 0.5 for w in ws)
    if not part.ok:
        part.lines.append(f"not finished with accuracy > 0.5 in {budget_s:.0f} s; logs under {out / 'cluster'}")
    return part


def _trained(cluster, budget_s: float) -> list:
    """The job's workers once both have finished or one has failed, or as they are after budget_s."""
    from peerd.errors import PeerdError

    def workers() -> list:
        return [w for p in cluster.peers if (j := job_status(cluster, p, "gpu-check")) for w in j.workers]

    def ended() -> bool:
        ws = workers()
        return any(w.state == "failed" for w in ws) or (len(ws) == 2 and all(w.state == "finished" for w in ws))

    try:
        poll_until(ended, budget_s, "the job to end", interval_s=1.0)
    except PeerdError:
        pass  # not finished in time: said worker by worker
    return workers()


def run_train(device: str, seconds: float) -> Part:
    """Samples/s on the device: the MNIST example through the Trainer, and a 64 MiB MLP."""
    part = Part("train")
    for precision in ("fp32", "bf16") if device == "cuda" else ("fp32",):
        part.lines.append(_trainer_rate(device, precision, seconds))
    # bf16 matmuls on a CPU without bf16 units take seconds a step: GPU only.
    for dtype in ("fp32", "bf16") if device == "cuda" else ("fp32",):
        part.lines.append(_mlp_rate(device, dtype, seconds))
    part.ok = True
    return part


def _trainer_rate(device: str, precision: str, seconds: float) -> str:
    from peerd.cli.localcluster import default_job
    from peerd.settings.jobspec import parse_job
    from peerd.worker.train.trainer import Trainer

    spec = parse_job(default_job().read_text() + f'\n[train]\nprecision = "{precision}"\n', "mnist")
    t = Trainer(spec, "check", device=device)
    for _ in range(2):  # warm-up: the loader starts, kernels are picked
        t.step(["check"])
    _sync(device)
    steps, samples, started = 0, t.samples, time.perf_counter()
    while (time.perf_counter() - started < seconds or steps < 3) and not t.done:
        t.step(["check"])
        steps += 1
    _sync(device)
    elapsed = time.perf_counter() - started
    t.close()
    return (f"MNIST example, Trainer on {device}, {precision}: {(t.samples - samples) / elapsed:,.0f} "
            f"samples/s (batch {t.local_batch}, {steps} steps)")


def _mlp_rate(device: str, name: str, seconds: float) -> str:
    import torch

    numel = MIB * 2**20 // 4
    width = int(math.isqrt(numel))  # one width × width Linear: 64 MiB of fp32 weights
    model = torch.nn.Sequential(torch.nn.Linear(width, width, bias=False)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = 256 if device == "cuda" else 8
    x = torch.randn(batch, width, device=device)
    dtype = torch.float32 if name == "fp32" else torch.bfloat16

    def step() -> None:
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: the first steps pick kernels and allocate
        step()
    _sync(device)
    steps, started = 0, time.perf_counter()
    while (device == "cuda" and time.perf_counter() - started < seconds / 2) or steps < 3:
        step()
        steps += 1
    _sync(device)
    elapsed = time.perf_counter() - started
    return (f"64 MiB MLP ({width}x{width}), {device}, {name}: {steps * batch / elapsed:,.0f} samples/s "
            f"({elapsed / steps * 1e3:.1f} ms/step, batch {batch})")


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_exchange(device: str, budget_s: float, tmp: Path) -> Part:
    """The 2-process exchange of 64 MiB over 127.0.0.1, and what a GPU worker adds."""
    import torch

    part = Part("exchange")
    report = tmp / "exchange.json"
    cmd = [sys.executable, str(ROOT / "bench" / "exchange.py"), "--methods", "peerd-copy,peerd", "--mib", str(MIB),
           "--repeats", "5", "--json", str(report)]
    part.lines.append("$ bench/exchange.py --methods peerd-copy,peerd --mib 64 --repeats 5")
    try:
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
    except subprocess.TimeoutExpired:
        part.ok = False
        part.lines.append(f"timed out after {budget_s:.0f} s")
        return part
    if run.returncode != 0:
        part.ok = False
        part.lines += run.stderr.strip().splitlines()[-5:]
        return part
    ms = json.loads(report.read_text())["ms"]
    part.lines.append(f"2 processes, 64 MiB, bulk lane: snapshot copied (a GPU model's path) {ms['peerd-copy']['median']:.1f} "
                      f"ms, handed over (a CPU model's path) {ms['peerd']['median']:.1f} ms (medians)")
    if device == "cuda":
        copies = _device_copies(MIB * 2**20 // 4)
        part.lines.append(f"GPU worker's copies per round (cuda -> pinned host, pinned host -> cuda): "
                          f"{copies:.1f} ms; a GPU model's round ~ {ms['peerd-copy']['median'] + copies:.1f} ms")
    else:
        part.lines.append("no GPU: the device copies of a GPU worker (cuda <-> pinned host) not measured")
    del torch
    part.ok = True
    return part


def _device_copies(numel: int, repeats: int = 10) -> float:
    """Median ms of the round's two copies (peerd.worker.round.rounds.Rounds.work): the device vector into the pinned work buffer,
    and back (non-blocking, then synchronised, as the next step would wait for it)."""
    import torch

    gpu = torch.randn(numel, device="cuda")
    work = torch.empty(numel, pin_memory=True)
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work.copy_(gpu)
        gpu.copy_(work, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


# --- the summary -------------------------------------------------------------------------


OWNER = ("import sys, torch; x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda:0'); "
         "torch.cuda.synchronize(); print('holding', flush=True); sys.stdin.read()")


def run_nvml(device: str, budget_s: float) -> Part:
    """The availability watch's GPU sampler on the real NVML: an owner's process
    appears in its samples and leaves them."""
    part = Part("nvml")
    if device != "cuda":
        part.lines.append("skipped: no GPU (the sampler runs against a stand-in with NVML's calls in the tests)")
        return part
    try:
        import pynvml  # nvidia-ml-py: peerd's `nvml` extra, in dev
    except ImportError as exc:
        part.ok = False
        part.lines.append(f"nvidia-ml-py is not installed ({exc}): pip install 'peerd[nvml]'")
        return part
    from peerd.daemon.usage import GpuSampler

    sampler = GpuSampler(pynvml)
    part.lines.append(f"NVML {pynvml.nvmlSystemGetDriverVersion()}: {sampler.what}")
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        owner.stdout.readline()  # "holding": its memory is allocated
        started = time.monotonic()
        seen = _until(lambda: any(u.pid == owner.pid for u in sampler.sample()), budget_s / 2)
        part.lines.append(f"owner pid {owner.pid} holding 256 MiB on cuda:0: "
                          + (f"seen after {seen - started:.2f} s" if seen else f"NOT seen in {budget_s / 2:.0f} s"))
        owner.stdin.close()
        owner.wait(timeout=30)
        ended = time.monotonic()
        gone = _until(lambda: all(u.pid != owner.pid for u in sampler.sample()), budget_s / 2)
        part.lines.append("owner ended: " + (f"gone from the samples after {gone - ended:.2f} s" if gone
                                              else f"still listed after {budget_s / 2:.0f} s"))
        part.ok = bool(seen and gone)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        sampler.close()
    return part


def _until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> float | None:
    """When `predicate()` first held (time.monotonic()), or None after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(interval_s)
    return None


def summary(device: str, info: list[str], parts: list[Part], elapsed: float) -> str:
    mark = {True: "PASS", False: "FAIL", None: "skip"}
    lines = ["", "=" * 78, "peerd GPU check: " + ("GPU found" if device == "cuda" else "NO GPU FOUND (CPU parts only)"),
             *("  " + line for line in info)]
    for p in parts:
        lines.append(f"[{mark[p.ok]}] {p.name} ({p.seconds:.0f} s)")
        lines += ["       " + line for line in p.lines]
    failed = [p.name for p in parts if p.ok is False]
    lines.append(f"{'FAILED: ' + ', '.join(failed) if failed else 'all parts run passed'} in {elapsed:.0f} s")
    lines.append("=" * 78)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, prog="bench/gpu_check.py")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: " + ", ".join(PARTS))
    p.add_argument("--train-seconds", type=float, default=10.0, help="seconds per throughput measurement")
    p.add_argument("--out", type=Path, default=None, help="keep the cluster's logs here (default: a temp dir)")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.skip - set(PARTS):
        p.error(f"--skip: unknown part(s) {sorted(args.skip - set(PARTS))}; choose from {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    device, info = device_info()
    print("\n".join(info), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="peerd-gpu-check-"))
    out = args.out or tmp
    # Budgets (s) that keep the whole check within 5 minutes on a GPU machine.
    plan: list[tuple[str, Callable[[], Part]]] = [
        ("tests", lambda: run_tests(device, 150.0 if device == "cuda" else 400.0)),
        ("train", lambda: run_train(device, args.train_seconds)),
        ("exchange", lambda: run_exchange(device, 120.0, tmp)),
        ("cluster", lambda: run_cluster(device, 90.0 if device == "cuda" else 240.0, out)),
        ("nvml", lambda: run_nvml(device, 40.0)),
    ]
    parts = []
    try:
        for name, run in plan:
            if name in args.skip:
                parts.append(Part(name, None, ["skipped (--skip)"]))
                continue
            print(f"running {name} ...", flush=True)
            t = time.monotonic()
            try:
                part = run()
            except Exception as exc:  # noqa: BLE001 - one broken part must not hide the others' results
                part = Part(name, False, [f"{type(exc).__name__}: {exc}"])
            part.seconds = time.monotonic() - t
            parts.append(part)
            print(f"  {name}: {'ok' if part.ok else 'skipped' if part.ok is None else 'FAILED'} in {part.seconds:.0f} s", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(summary(device, info, parts, time.monotonic() - started), flush=True)
    return 1 if any(p.ok is False for p in parts) else 0


if __name__ == "__main__":
    run_main(main)
