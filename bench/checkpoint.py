#!/usr/bin/env python
"""Checkpoint cost: writing and reading a worker checkpoint (parameters + momentum,
fp32) against a plain `torch.save` / `torch.load` of the same tensor, measured in
the same invocation on the same disk.

peerd's write adds a sha256 over the payload, an fsync of the file and of its
directory; its read verifies the checksum and that every value is finite.

    .venv/bin/python bench/checkpoint.py                    # 10M parameters, 5 repeats
    .venv/bin/python bench/checkpoint.py --params 1000000 --repeats 3 --dir /var/tmp
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import torch

from harness.script import arg_parser, run_main, timed
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.state.pull import StateMeta


def torch_save(vector: torch.Tensor, path: Path) -> None:
    with open(path, "wb") as f:  # the baseline also fsyncs the file, as model.pt does
        torch.save(vector, f)
        f.flush()
        os.fsync(f.fileno())


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__)
    parser.add_argument("--params", type=int, default=10_000_000, help="model parameters (state = 2x)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    return parser.parse_args(argv)


def measure(vector: torch.Tensor, repeats: int, where: Path | None) -> dict[str, list[float]]:
    """Seconds of each way, per repeat, the two of a kind interleaved."""
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        ckpts = CheckpointDir(Path(tmp) / "ckpt", "bench", "fp", vector.numel())
        rows = {"peerd save": [], "torch.save": [], "peerd load": [], "torch.load": []}
        for r in range(repeats):
            rows["torch.save"].append(timed(lambda: torch_save(vector, Path(tmp) / "plain.pt")))
            rows["peerd save"].append(timed(lambda: ckpts.save(StateMeta(r, r, 0.0), vector)))
            rows["torch.load"].append(timed(lambda: torch.load(Path(tmp) / "plain.pt", weights_only=True)))
            rows["peerd load"].append(timed(lambda: ckpts.load_newest()))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    vector = torch.randn(2 * args.params)
    rows = measure(vector, args.repeats, args.dir)
    size_mb = vector.numel() * 4 / 1e6
    print(f"state of {args.params:,} parameters + momentum = {size_mb:.0f} MB, median of {args.repeats}")
    for name, times in rows.items():
        median = statistics.median(times)
        print(f"{name:11s} {median * 1000:8.1f} ms  {size_mb / median:7.0f} MB/s")
    print(f"ratio save peerd/torch: {statistics.median(rows['peerd save']) / statistics.median(rows['torch.save']):.2f}")
    print(f"ratio load peerd/torch: {statistics.median(rows['peerd load']) / statistics.median(rows['torch.load']):.2f}")
    return 0


if __name__ == "__main__":
    run_main(main)
