"""Why a worker failed, as the daemon keeps it (peerd.daemon.jobs): its last error
line and the last lines of its traceback, from the worker's own output; and the
supervisor carrying out the crash limit (peerd.core.restarts)."""

from __future__ import annotations

import logging
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from conftest import until
from peerd.core.codes import WorkerState
from peerd.core.restarts import CrashLimit
from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch, WorkerProcess
from peerd.daemon.reason import KEPT, TRACEBACK_LINE_CHARS, TRACEBACK_LINES, TracebackTail, error_line, kept
from peerd.logs import OneLineFormatter


def record(fmt: str, level: int, msg: str) -> bytes:
    """One line of a worker's log, as peerd.logs writes it."""
    entry = logging.LogRecord("peerd.worker", level, __file__, 1, msg, (), None)
    return (OneLineFormatter(fmt, {"job": "j", "peer": "p"}).format(entry) + "\n").encode()


def a_traceback(depth: int) -> str:
    def dive(n: int) -> None:
        if n == 0:
            raise ValueError('boom "quoted" \\ at step 3')
        dive(n - 1)

    try:
        dive(depth)
    except ValueError:
        return traceback.format_exc().rstrip()
    raise AssertionError("no exception")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_scripts_logged_traceback_and_error_line_are_kept(fmt):
    tail = TracebackTail()
    text = a_traceback(1)
    lines = [record(fmt, logging.INFO, "training from round 0"),
             record(fmt, logging.WARNING, "the script's traceback:\n" + text),
             record(fmt, logging.ERROR, "the script boom.py failed: ValueError: boom")]
    changed = [tail.feed(line) for line in lines]
    assert changed == [False, True, False]
    assert tail.lines == tuple(text.splitlines()[-TRACEBACK_LINES:])
    assert tail.lines[-1] == 'ValueError: boom "quoted" \\ at step 3'  # unescaped as it was raised
    assert [error_line(line) for line in lines] == ["", "", "the script boom.py failed: ValueError: boom"]


def test_only_the_last_lines_of_a_long_traceback_are_kept():
    tail = TracebackTail()
    text = a_traceback(30)
    tail.feed(record("text", logging.WARNING, "the script's traceback:\n" + text))
    assert len(text.splitlines()) > TRACEBACK_LINES
    assert tail.lines == tuple(text.splitlines()[-TRACEBACK_LINES:])


def test_frames_of_frozen_modules_are_left_out(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def main():\n    raise ValueError('boom')\n\nmain()\n")
    code = f"import runpy\nrunpy.run_path({str(script)!r}, run_name='__main__')\n"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).stderr
    assert b'File "<frozen runpy>"' in printed
    tail = TracebackTail()
    for line in printed.splitlines(keepends=True):
        tail.feed(line)
    assert not any("<frozen" in line for line in tail.lines)
    assert tail.lines[-3:] == (f'  File "{script}", line 2, in main', "    raise ValueError('boom')",
                               "ValueError: boom")


def test_a_traceback_python_printed_is_kept_chained_ones_included():
    code = "def f():\n try:\n  1/0\n except Exception as e:\n  raise KeyError('x') from e\nf()\n"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).stderr
    tail = TracebackTail()
    for line in [b"a line the script printed\n", *printed.splitlines(keepends=True),
                 record("text", logging.INFO, "after"), b"  an indented line after it\n"]:
        tail.feed(line)
    assert tail.lines[0] == "Traceback (most recent call last):"
    assert "ZeroDivisionError: division by zero" in tail.lines
    assert tail.lines[-1] == "KeyError: 'x'"
    assert error_line(printed.splitlines()[-1]) == "KeyError: 'x'"


def test_a_newer_traceback_replaces_the_older():
    tail = TracebackTail()
    tail.feed(record("text", logging.WARNING, "the script's traceback:\n" + a_traceback(0)))
    tail.feed(b"Traceback (most recent call last):\n")
    tail.feed(b'  File "x.py", line 1, in <module>\n')
    assert tail.feed(b"RuntimeError: second\n")
    assert tail.lines == ("Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                          "RuntimeError: second")


# --- the supervisor -----------------------------------------------------------------------

class ScriptedWorker(WorkerProcess):
    """A WorkerProcess whose runs print the given lines and exit with the given code,
    without a process: the supervision loop is the real one."""

    runs: list[tuple[list[bytes], int]]

    async def _run_once(self) -> int:
        self._run_message, self._tail = "", TracebackTail()
        lines, code = self.runs.pop(0) if len(self.runs) > 1 else self.runs[0]
        for line in lines:
            self._on_line(line)
        return code


def scripted(tmp_path: Path, runs, limit: CrashLimit) -> tuple[ScriptedWorker, list[str]]:
    launch = WorkerLaunch("unix:x", "peer-0", "127.0.0.1", 1, tmp_path / "job.toml", str(tmp_path),
                          tmp_path / "worker.log")
    ended: list[str] = []
    worker = ScriptedWorker("job", "peer-0", launch, RestartPolicy(0.01, 0.02, limit))
    worker.on_end = lambda: ended.append(worker.state)
    worker.runs = list(runs)
    return worker, ended


async def test_a_worker_that_keeps_crashing_fails_with_its_error_and_traceback(tmp_path, caplog):
    text = a_traceback(2)
    crash = [record("text", logging.WARNING, "the script's traceback:\n" + text),
             record("text", logging.ERROR, "the script boom.py failed: ValueError: boom")]
    worker, ended = scripted(tmp_path, [(crash, 1)], CrashLimit(3, 60.0))
    with caplog.at_level(logging.INFO, logger="peerd.jobs"):
        worker.start()
        await until(lambda: worker.state == WorkerState.FAILED, "the worker to fail", 10)
        await worker._task
    assert worker.restarts == 2 and ended == [WorkerState.FAILED]
    first, *rest = worker.why.splitlines()
    assert first == "crashed 3 times in 60s, not restarted; last: the script boom.py failed: ValueError: boom"
    assert tuple(rest) == tuple(text.splitlines()[-TRACEBACK_LINES:])
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert gave_up == [f"job job: worker peer-0 crashed 3 times in 60s; not restarting it: the job failed here "
                       f"(last error: the script boom.py failed: ValueError: boom; see {tmp_path / 'worker.log'})"]


async def test_a_crash_without_an_error_line_says_how_it_exited_and_forgets_the_old_traceback(tmp_path):
    crash = [record("text", logging.WARNING, "the script's traceback:\n" + a_traceback(0)),
             record("text", logging.ERROR, "the script boom.py failed: ValueError: boom")]
    worker, ended = scripted(tmp_path, [(crash, 1), ([b"killed\n"], -9)], CrashLimit(2, 60.0))
    worker.start()
    await until(lambda: worker.state == WorkerState.FAILED, "the worker to fail", 10)
    await worker._task
    assert worker.why == "crashed 2 times in 60s, not restarted; last: exited with signal SIGKILL"


async def test_without_a_limit_a_crashing_worker_restarts_and_shows_why_meanwhile(tmp_path):
    crash = [record("json", logging.ERROR, "lost the daemon: no heartbeat answer; stopping")]
    worker, ended = scripted(tmp_path, [(crash, 1)], CrashLimit(0, 60.0))
    worker.start()
    try:
        await until(lambda: worker.restarts >= 5, "five restarts", 10)
        assert worker.state in (WorkerState.RESTARTING, WorkerState.STARTING) and not ended
        assert worker.why == "lost the daemon: no heartbeat answer; stopping"
    finally:
        await worker.stop(drain=False)
    assert worker.state == WorkerState.STOPPED and not ended


def test_long_lines_are_cut_short_and_a_deep_traceback_keeps_its_end(tmp_path):
    long = "x" * 5000
    script = tmp_path / "deep.py"
    script.write_text("def a(n):\n    return b(n - 1) if n else boom()\n\ndef b(n):\n    return a(n - 1)\n\n"
                      f"def boom():\n    raise RuntimeError({long!r})\n\na(20)\n")
    printed = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60).stderr
    assert len(printed.splitlines()) > 40
    tail = TracebackTail()
    for line in printed.splitlines(keepends=True):
        tail.feed(line)
    assert len(tail.lines) == TRACEBACK_LINES and all(len(x) <= TRACEBACK_LINE_CHARS for x in tail.lines)
    assert tail.lines[-1] == ("RuntimeError: " + long)[:TRACEBACK_LINE_CHARS]
    assert tail.lines[-3] == f'  File "{script}", line 8, in boom'  # the innermost frame, not the outermost
    assert error_line(printed.splitlines()[-1]) == ("RuntimeError: " + long)[:500]



def test_caret_lines_under_the_source_are_left_out(tmp_path):
    script = tmp_path / "carets.py"
    script.write_text("def boom():\n    raise KeyError('k')\n\ntotal = 1 + boom()\n")
    printed = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60).stderr
    tail = TracebackTail()
    for line in printed.splitlines(keepends=True):
        tail.feed(line)
    assert tail.lines == ("Traceback (most recent call last):", f'  File "{script}", line 4, in <module>',
                          "    total = 1 + boom()", f'  File "{script}", line 2, in boom',
                          "    raise KeyError('k')", "KeyError: 'k'")

async def test_the_reason_is_kept_beside_the_log_for_a_resumed_job_and_cleared_once_it_runs(tmp_path):
    from conftest import example_job
    from peerd.proto.v1 import control_pb2
    from peerd.settings.jobspec import parse_job

    text = a_traceback(1)
    crash = [*(line.encode() + b"\n" for line in text.splitlines())]
    worker, ended = scripted(tmp_path, [(crash, 1)], CrashLimit(1, 60.0))
    worker.start()
    await until(lambda: worker.state == WorkerState.FAILED, "the worker to fail", 10)
    await worker._task
    first = 'crashed once in 60s, not restarted; last: ValueError: boom "quoted" \\ at step 3'
    assert worker.why.splitlines()[0] == first
    assert (tmp_path / KEPT).read_text() == worker.why + "\n"
    assert kept(tmp_path) == (first, tuple(text.splitlines()[-TRACEBACK_LINES:]))

    spec = parse_job(example_job(), "job")
    # The daemon restarts and resumes the job: a new worker shows the kept reason until it runs.
    again, _ = scripted(tmp_path, [([], 0)], CrashLimit(1, 60.0))
    LocalJob(spec, tmp_path, [again]).carry_reasons(resumed=True)
    assert again.why == worker.why
    again.on_heartbeat(control_pb2.WorkerReport(job="job", member="peer-0", address="127.0.0.1:1"))
    assert again.state == WorkerState.RUNNING and again.why == "" and not (tmp_path / KEPT).exists()

    # A new join of the job (after a leave, or after it ended) starts without the old reason.
    (tmp_path / KEPT).write_text(worker.why + "\n")
    fresh, _ = scripted(tmp_path, [([], 0)], CrashLimit(1, 60.0))
    LocalJob(spec, tmp_path, [fresh]).carry_reasons(resumed=False)
    assert fresh.why == "" and not (tmp_path / KEPT).exists()
