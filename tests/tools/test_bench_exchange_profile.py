"""The pure parts of bench/exchange_profile.py: perf report lines sorted into
what ran, and its arguments (no perf, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from exchange_profile import categorise, parse_args  # noqa: E402

REPORT = """\
# Samples: 9K of event 'cpu-clock'
#
      5940  [kernel.kallsyms]        [k] _copy_to_iter
       533  [kernel.kallsyms]        [k] tcp_sendmsg_locked
       120  [kernel.kallsyms]        [k] exc_page_fault
      3233  libtorch_cpu.so          [.] c10::function_ref<...>::add_kernel(at::TensorIteratorBase&)
      2462  libgloo.so               [.] gloo::sum<float>
      5350  libtorch_cpu.so          [.] c10::function_ref<...>::direct_copy_kernel(at::TensorIteratorBase&)
      3054  libpython3.11.so.1.0     [.] _PyEval_EvalFrameDefault
        10  libc.so.6                [.] malloc
"""


def test_samples_are_sorted_into_what_ran_first_match_wins():
    got = categorise(REPORT)
    assert got == {
        "kernel: receive copy": 5940,
        "kernel: TCP stack, scheduling, other": 533,
        "kernel: page faults": 120,
        "arithmetic (mean, mix, checks)": 3233 + 2462,
        "tensor copies": 5350,
        "Python interpreter": 3054,
        "other (libtorch dispatch, libc, uvloop, grpc, gloo)": 10,
    }


def test_the_long_run_must_have_more_repeats_than_the_short_one():
    assert parse_args(["--short", "5", "--long", "25"]).long == 25
    for bad in (["--short", "10", "--long", "10"], ["--short", "0", "--long", "5"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
