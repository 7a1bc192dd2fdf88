"""The leak checks of tests/conftest.py fail a test that leaves something behind.

Each case runs in a pytest of its own (a subprocess, with this suite's conftest
and settings), as a leaking test would run in the suite, and its verdict and
message are read back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

CASES = '''
import asyncio
import threading


async def test_leaves_a_task_pending():
    asyncio.create_task(asyncio.sleep(3600), name="forgotten")


async def test_cancels_and_awaits_its_task():
    task = asyncio.create_task(asyncio.sleep(3600))
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def test_task_that_is_ending_gets_the_grace():
    asyncio.create_task(asyncio.sleep(0.1))


def test_leaves_a_thread_running():
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="forgotten-thread", daemon=True).start()


def test_leaves_nothing():
    pass
'''

INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> dict[str, str]:
    """Each case's name -> its teardown error ("" when none), and "output": all of it."""
    where = tmp_path_factory.mktemp("leaks")
    (where / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (where / "pytest.ini").write_text(INI)
    (where / "test_cases.py").write_text(CASES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "PEERD_TEST_LEAK_GRACE_S": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           str(where)], cwd=where, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    errors = {name: "" for name in ("test_leaves_a_task_pending", "test_cancels_and_awaits_its_task",
                                    "test_task_that_is_ending_gets_the_grace", "test_leaves_a_thread_running",
                                    "test_leaves_nothing")}
    for block in output.split("ERROR at teardown of ")[1:]:
        name, _, text = block.partition(" ")
        errors[name] = text.split("\n", 1)[1].split("\n_____", 1)[0].split("\n=====", 1)[0].strip()
    assert "5 passed, 2 errors" in output, output
    return {**errors, "output": output}


def test_a_pending_task_fails_the_test_and_names_it(outcome):
    assert outcome["test_leaves_a_task_pending"] == (
        "the test left asyncio tasks pending: forgotten running sleep (cancel and await them before the test ends)"
    ), outcome["output"]


def test_a_cancelled_and_awaited_task_or_one_that_ends_in_the_grace_is_no_leak(outcome):
    assert outcome["test_cancels_and_awaits_its_task"] == "", outcome["output"]
    assert outcome["test_task_that_is_ending_gets_the_grace"] == "", outcome["output"]


def test_a_thread_left_running_fails_the_test(outcome):
    assert outcome["test_leaves_a_thread_running"] == "the test left behind: thread 'forgotten-thread'", \
        outcome["output"]


def test_a_clean_test_passes(outcome):
    assert outcome["test_leaves_nothing"] == "", outcome["output"]
