"""One-line log records for journald and files: logfmt-style text or JSON.

    ts=2026-11-30T11:40:00.123Z level=info logger=peerd.worker job=mnist peer=a msg="training from round 0"
    {"ts": "2026-11-30T11:40:00.123Z", "level": "info", "logger": "peerd.worker", "job": "mnist", "msg": "..."}

A traceback stays on the record's line (newlines escaped), so journald and
`grep` see one record per line. `context` (e.g. job, peer) is added to every record.
"""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")


class OneLineFormatter(logging.Formatter):
    def __init__(self, fmt: str = "text", context: dict[str, str] | None = None) -> None:
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.kind = fmt
        self.context = dict(context or {})

    def _fields(self, record: logging.LogRecord) -> dict[str, str]:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        fields = {"ts": ts, "level": record.levelname.lower(), "logger": record.name, **self.context,
                  "msg": record.getMessage()}
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return fields

    def format(self, record: logging.LogRecord) -> str:
        fields = self._fields(record)
        if self.kind == "json":
            return json.dumps(fields, ensure_ascii=False)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: str) -> str:
    if value and all(c.isalnum() or c in "-_.:/@[]+" for c in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def setup_logging(level: str = "INFO", fmt: str = "text", **context: str) -> None:
    """Send every record to stderr as one line (journald reads stderr under systemd)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(fmt, context))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
