"""One-line log records (logfmt-like text or JSON) for journald."""

from __future__ import annotations

import json
import logging
import re

import pytest

from peerd.logs import OneLineFormatter


def record(msg: str, *args, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom\nsecond line")
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("peerd.worker", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_text_records_are_one_line_key_values():
    line = OneLineFormatter("text", {"job": "mnist", "peer": "box-1"}).format(record("took %d rounds", 5))
    assert re.fullmatch(r'ts=\S+Z level=warning logger=peerd.worker job=mnist peer=box-1 msg="took 5 rounds"', line)


def test_a_traceback_and_quotes_stay_on_the_line():
    line = OneLineFormatter("text").format(record('bad "value"\nhere', exc=True))
    assert "\n" not in line
    assert 'msg="bad \\"value\\"\\nhere"' in line
    assert 'exc="Traceback' in line and "RuntimeError: boom\\nsecond line" in line


def test_json_records_parse_back():
    line = OneLineFormatter("json", {"job": "j"}).format(record("x=%s", "ü", exc=True))
    data = json.loads(line)
    assert "\n" not in line
    assert (data["level"], data["logger"], data["job"], data["msg"]) == ("warning", "peerd.worker", "j", "x=ü")
    assert "RuntimeError" in data["exc"]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="text, json"):
        OneLineFormatter("xml")
