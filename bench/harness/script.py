"""The skeleton of a bench script: its arguments, its run folder, timing, and
the __main__ wrapper (exit codes, SIGTERM as Ctrl+C)."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import ROOT
from peerd.errors import PeerdError
from peerd.cli.interrupts import sigterm_interrupts


def arg_parser(doc: str, *, defaults: bool = False, raw: bool = False, **kwargs) -> argparse.ArgumentParser:
    """A script's parser, described by its docstring's first paragraph (unless
    `description` is given). `defaults`: every argument's default in --help;
    `raw`: the description's lines as written."""
    kwargs.setdefault("description", doc.split("\n\n")[0])
    if defaults:
        kwargs["formatter_class"] = argparse.ArgumentDefaultsHelpFormatter
    elif raw:
        kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(**kwargs)


def names(parser: argparse.ArgumentParser, text: str, known: Iterable[str], flag: str) -> list[str]:
    """A comma-separated choice of `known`, in the order given; a usage error otherwise."""
    known = list(known)
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    if not chosen or any(v not in known for v in chosen):
        parser.error(f"{flag}: choose from {', '.join(known)}")
    return chosen


def numbers(parser: argparse.ArgumentParser, text: str, kind: type, flag: str) -> list:
    """Comma-separated numbers of `kind` (int or float); a usage error otherwise."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag}: {'whole ' if kind is int else ''}numbers separated by commas")


def run_dir(out: Path | None, name: str) -> Path:
    """`out`, or runs/NAME-TIMESTAMP under the repository; made."""
    out = out or ROOT / "runs" / time.strftime(f"{name}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def load_logged() -> Iterator[list[list[str]]]:
    """The machine's load averages (1, 5, 15 min) at the start and at the end,
    printed and kept in the list yielded (for the summary): the machine is shared."""
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    print(f"load average at the start: {' '.join(load[0])}", flush=True)
    yield load
    load.append(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average at the end: {' '.join(load[1])}", flush=True)


def timed(fn: Callable[[], object]) -> float:
    """Seconds fn() took, on the performance counter."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def each_timed(keys: Iterable[str], run: Callable[[str], dict], label: Callable[[str], str] = str,
               note: Callable[[dict], str] = lambda result: "") -> dict[str, dict]:
    """run(key) for each key in turn, saying how long each took."""
    results = {}
    for key in keys:
        started = time.monotonic()
        results[key] = run(key)
        print(f"  {label(key)}: done in {time.monotonic() - started:.1f} s{note(results[key])}", flush=True)
    return results


def run_main(main: Callable[[], int | None], after: Callable[[], None] = lambda: None) -> None:
    """Run a bench script's main and exit with its code: SIGTERM ends it as Ctrl+C
    does (130, after its cleanup: every daemon and process it started is stopped),
    a PeerdError says what failed (1), a crash prints its traceback (1); `after`
    runs last."""
    try:
        with sigterm_interrupts():
            code = main() or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except PeerdError as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        code = 1
    except Exception:
        traceback.print_exc()
        code = 1
    after()  # after the handler: the traceback no longer holds what `after` frees
    sys.exit(code)
