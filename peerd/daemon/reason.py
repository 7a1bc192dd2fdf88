"""Why a worker crashed or failed, from its own output: its last error line and
the last lines of its newest traceback, each line cut short, as `peerctl status`,
the live page and `peerd cluster` show them (docs/operations.md, "When a worker
crashes"). The daemon keeps the reason beside the worker's log too, so a job
resumed after a daemon restart still shows it until the worker runs again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("peerd.jobs")
TRACEBACK_LINES = 10  # of a worker's last traceback, kept for peerctl status
TRACEBACK_LINE_CHARS = 300
ERROR_LINE_CHARS = 500
KEPT = "error.txt"  # beside worker.log while the worker has a reason


_ERROR_MSG = re.compile(rb'level=error .*?msg="(.*)"\s*$')
_EXCEPTION = re.compile(rb"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b.*$")
_RECORD = re.compile(r"ts=\S+ level=\w+ ")  # a text record of peerd.logs
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
_ESCAPE = re.compile(r"\\(.)")
TRACEBACK_HEAD = "Traceback (most recent call last):"
_CARETS = re.compile(r"[~^]+")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def record_fields(line: bytes) -> dict[str, str] | None:
    """The fields of one of a worker's log records (peerd.logs, text or JSON),
    values unescaped; None for any other line."""
    text = line.decode(errors="replace").strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            return None
        if isinstance(record, dict) and "level" in record and "msg" in record:
            return {str(k): str(v) for k, v in record.items()}
        return None
    if not _RECORD.match(text):
        return None
    return {key: _ESCAPE.sub(_unescape, value[1:-1]) if value.startswith('"') else value
            for key, value in _FIELD.findall(text)}


def _unescape(match: re.Match) -> str:
    return {"n": "\n", "r": "\r"}.get(match.group(1), match.group(1))


def error_line(line: bytes) -> str:
    """The message of a worker's error record or the last line of a traceback
    ("ModuleNotFoundError: No module named 'foo'"); "" for any other line."""
    fields = record_fields(line)
    if fields is not None:
        text = fields.get("msg", "") if fields.get("level") == "error" else ""
    else:
        match = _ERROR_MSG.search(line) or _EXCEPTION.match(line.strip())
        if not match:
            return ""
        text = (match.group(1) if match.re is _ERROR_MSG else match.group(0)).decode(errors="replace")
        text = text.replace("\\n", " ")
    return " ".join(text.splitlines()).strip()[:ERROR_LINE_CHARS]


class TracebackTail:
    """The last TRACEBACK_LINES lines of the newest traceback in a worker's
    output: one a log record carries (a script's traceback; a record's exc) or
    one Python printed (an uncaught exception), chained ones included."""

    def __init__(self) -> None:
        self.lines: tuple[str, ...] = ()
        self._raw: list[str] | None = None  # a printed traceback being read
        self._ended = False  # ... that reached its exception line: only a chained one may follow

    def feed(self, line: bytes) -> bool:
        """Take one line of output; True when `lines` changed."""
        fields = record_fields(line)
        if fields is not None:
            self._raw = None
            for key in ("exc", "msg"):
                text = fields.get(key, "")
                if TRACEBACK_HEAD in text:
                    return self._set(text[text.index(TRACEBACK_HEAD):].splitlines())
            return False
        text = line.decode(errors="replace").rstrip()
        if text.startswith(TRACEBACK_HEAD) and self._raw is None:
            self._raw, self._ended = [], False
        if self._raw is None:
            return False
        if text.startswith((TRACEBACK_HEAD, *_CHAINED)) or not text.strip():
            self._ended = False
        elif text[:1].isspace():  # a frame, its source line, carets
            if self._ended:
                self._raw = None
                return False
        elif self._ended:  # unindented after the exception line: the traceback is over
            self._raw = None
            return False
        else:
            self._ended = True  # the exception line
        self._raw.append(text)
        del self._raw[:-4 * TRACEBACK_LINES]  # blank lines are dropped from `lines`
        return self._set(self._raw)

    def _set(self, lines: list[str]) -> bool:
        # Frames of frozen modules (runpy running a script) have no source line, and the
        # carets under a source line (~~~^^^) only point into it: neither says anything here.
        lines = tuple(x.rstrip()[:TRACEBACK_LINE_CHARS] for x in lines
                      if x.strip() and not x.lstrip().startswith('File "<frozen ')
                      and not _CARETS.fullmatch(x.strip()))[-TRACEBACK_LINES:]
        changed, self.lines = lines != self.lines, lines
        return changed


def keep(directory: Path, why: str) -> None:
    """Write a worker's reason (its error line, then its traceback's lines) to
    `directory`/error.txt, or remove that file when `why` is "" (the worker runs)."""
    path = directory / KEPT
    try:
        if not why:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{KEPT}.tmp")
        tmp.write_text(why + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # the reason stays in memory and in worker.log all the same
        log.warning("could not keep the worker's reason in %s: %s", path, exc)


def kept(directory: Path) -> tuple[str, tuple[str, ...]]:
    """The reason `keep` wrote to `directory`: (error line, traceback lines),
    bounded as when it was taken; ("", ()) when there is none."""
    try:
        lines = (directory / KEPT).read_text(errors="replace").splitlines()
    except OSError:
        return "", ()
    if not lines:
        return "", ()
    return (lines[0][:ERROR_LINE_CHARS * 2],  # with the crash limit's words before it
            tuple(x[:TRACEBACK_LINE_CHARS] for x in lines[1:] if x.strip())[-TRACEBACK_LINES:])
