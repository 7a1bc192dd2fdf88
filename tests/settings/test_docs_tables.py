"""The key tables of docs/operations.md against the keys the settings code reads.

The code's reads are recorded (every `Table.get`, with its default) while it parses
sample daemon configs and job files that together reach every key; the tables are
then checked both ways: every key read has a row, every row names a key read, and a
row's default is the code's where the cell is one literal.
"""

from __future__ import annotations

import ast
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from peerd.settings import tomlconf
from peerd.settings.config import parse_config
from peerd.settings.jobspec import parse_job
from peerd.settings.tomlconf import Table

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "operations.md"
DAEMON_SECTION = "## Daemon config (`/etc/peerd/peerd.toml`)"
JOB_SECTION = "## The job file (`JOB.toml`)"
HEADER = "| key | default | meaning |"
DAEMON_MODULES = ("config.py",)
JOB_MODULES = ("jobspec.py", "jobtables.py")
ANY_OTHER_KEY = "*"  # a row "`[table]` any other key": the table's rest() is taken as it is
REQUIRED = tomlconf._MISSING
VARIES = object()  # the code's default depends on other keys (e.g. metric_mode on metric)


@dataclass
class Reads:
    defaults: dict[tuple[str, str], object] = field(default_factory=dict)
    tables: set[tuple[str, str]] = field(default_factory=set)  # (parent, name) of each sub-table
    rest: set[str] = field(default_factory=set)  # tables whose unread keys are taken as they are

    def keys(self) -> dict[tuple[str, str], object]:
        return {k: v for k, v in self.defaults.items() if k not in self.tables}


@pytest.fixture
def recorder(monkeypatch):
    """Reads of every Table while the test parses; `sub` is a `get` of a table,
    told apart so that tables are not taken for keys."""
    reads = Reads()
    get, sub, rest = Table.get, Table.sub, Table.rest

    def recording_get(self, key, kind, default=REQUIRED, check=None, expect=""):
        seen = reads.defaults.setdefault((self._name, key), default)
        if not _same(seen, default) and seen is not VARIES:
            reads.defaults[(self._name, key)] = VARIES
        return get(self, key, kind, default, check, expect)

    def recording_sub(self, key):
        reads.tables.add((self._name, key))
        return sub(self, key)

    def recording_rest(self):
        reads.rest.add(self._name)
        return rest(self)

    monkeypatch.setattr(Table, "get", recording_get)
    monkeypatch.setattr(Table, "sub", recording_sub)
    monkeypatch.setattr(Table, "rest", recording_rest)
    return reads


# --- what the code reads ------------------------------------------------------------

DAEMON_CONFIGS = [
    "",
    # every table, the optional sections on: tls, auth, when-free availability, a device list
    """
    [daemon]
    host = "auto"
    peer_id = "gpu-box-3"
    [discovery]
    interfaces = ["all"]
    seeds = ["10.2.0.7:7070"]
    full_mesh_max = 4
    fanout = 2
    [worker]
    devices = ["cuda:0", "cuda:1"]
    slowdown = 2.0
    slowdown_clock = "cpu"
    step_overhead_s = 0.1
    [auth]
    realm_secret_file = "realm.secret"
    job_secret_file = "job.secret"
    [tls]
    cert_file = "host.pem"
    key_file = "host.key"
    ca_file = "ca.pem"
    server_name = "peerd.lab"
    [metrics]
    port = 9464
    [log]
    format = "json"
    tensorboard = "tb"
    [data]
    root = "data"
    [availability]
    mode = "when-free"
    windows = ["22:00-07:00", "Sat 00:00-Mon 07:00"]
    cpu_share = 1.5
    hold_off_s = 60
    check_interval_s = 2
    commands = ["matlab"]
    """,
    '[worker]\ndevices = "auto"\n',
    '[worker]\ndevice = "cuda:0"\ndevices = ["cuda:0"]\n',
    '[daemon]\nhost = "::1"\n[tls]\nserver_name = ""\n',
]

_MODULE_JOB = """
[job]
name = "every-key"
module = "peerd.examples.mnist"
model = "peerd.examples.mnist:make_model"
data = "peerd.examples.mnist:make_datasets"
metric = "val_loss"
chance = 2.3
seed = 7
init = "per-peer"
epochs = 0.5
drop_last = true
epoch_chunks = 4
eval_every_rounds = 10
min_peers = 3
start_timeout_s = 60
secret_file = "job.secret"
files = ["helpers.py", "configs/"]
code = "{code}"

[optimizer]
name = "adamw"
lr = 0.001
betas = [0.9, 0.95]
weight_decay = 0.1
schedule = "linear"
warmup_steps = 20
reference_batch = 96
scaling = "linear"
max_scale = inf
ramp_steps = 0

[gossip]
period_steps = 2
mode = "hierarchical"
group_size = 8
wire = "int8"
clip_factor = 3.0
segments = 16
chunk_kib = 256
deadline_floor_s = 1
deadline_ceiling_s = 5
overlap = true
average_buffers = true
average_optimizer_state = true

[train]
precision = "fp16"
grad_clip_norm = 1.0

[data]
loader_workers = 2
pin_memory = false
prefetch_factor = 4

[checkpoint]
every_rounds = 50
every_s = 0

[log]
tensorboard = "tb"
""".replace("{code}", "0" * 64)

JOB_FILES = [
    _MODULE_JOB,
    # a script job
    '[job]\nname = "script"\nscript = "train.py"\nargs = ["--fast"]\nfiles = ["lib.py"]\n',
    # local data, with this peer's own root
    '[job]\nname = "local"\nmodule = "m"\ndata_mode = "local"\nweighting = "uniform"\n[data]\nroot = "d"\n',
    # DBS
    """
    [job]
    name = "dbs"
    module = "m"
    global_batch = 256
    min_local_batch = 8
    max_local_batch = 64
    rebalance_rounds = 5
    rebalance_threshold = 0.2
    step_model = "proportional"
    """,
    # model and data without a job module; whole-model gossip
    '[job]\nname = "entries"\nmodel = "m:f"\ndata = "m:g"\nlocal_batch = 8\n[gossip]\nmode = "whole"\n',
    # the outer step
    '[job]\nname = "outer"\nmodule = "m"\n[outer]\nevery = 8\nlr = 0.5\nmomentum = 0.8\nnesterov = false\n',
]


def _example_jobs() -> list[Path]:
    return sorted((REPO / "peerd" / "examples").glob("*.toml")) + sorted((REPO / "examples").glob("*.toml"))


def _daemon_reads(recorder: Reads, tmp_path: Path) -> Reads:
    source = str(tmp_path / "peerd.toml")
    texts = [*DAEMON_CONFIGS, (REPO / "systemd" / "peerd.toml").read_text()]
    for text in texts:
        parse_config(tomllib.loads(_dedent(text)), source)
    return recorder


def _job_reads(recorder: Reads) -> Reads:
    for text in JOB_FILES:
        parse_job(_dedent(text), "job.toml")
    for path in _example_jobs():
        parse_job(path.read_text(), str(path))
    return recorder


def _dedent(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines()) + "\n"


def _literal_keys(modules: tuple[str, ...]) -> set[str]:
    """Keys named as literals in `.get("key", kind, ...)` calls of these modules: a
    key read only under a condition the samples above miss shows up as unread."""
    keys = set()
    for name in modules:
        tree = ast.parse((REPO / "peerd" / "settings" / name).read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                keys.add(node.args[0].value)
    return keys


# --- what the docs say --------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    line: int
    keys: tuple[tuple[str, str], ...]  # (table, key); key ANY_OTHER_KEY for "any other key"
    default: str  # the cell as written

    def __str__(self) -> str:
        return f"docs/operations.md:{self.line}"


def _cells(line: str) -> list[str]:
    """A table row's cells; a `|` inside backticks is text."""
    cells, cell, code = [], "", False
    for char in line.strip().removeprefix("|").removesuffix("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*cells, cell.strip()]


_KEY_CELL = re.compile(r"`\[(?P<table>[\w.]+)\](?: (?P<key>\w+))?`(?P<more>(?:, `\w+`)*)(?P<any> any other key)?")


def doc_rows(section: str) -> tuple[list[Row], list[str]]:
    """The rows of the section's key table (the lines from its header to the first
    line that is not a row), and a complaint for each key row after its end."""
    lines = DOCS.read_text().splitlines()
    assert section in lines, f"docs/operations.md has no section {section!r}"
    start = lines.index(section)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    header = next((i for i in range(start, end) if lines[i].strip() == HEADER), None)
    assert header is not None, f"{section}: no table headed {HEADER!r}"
    rows, i = [], header + 2
    for i in range(header + 2, end):
        if not lines[i].startswith("|"):
            break
        cells = _cells(lines[i])
        match = _KEY_CELL.fullmatch(cells[0])
        assert match and len(cells) == 3, f"docs/operations.md:{i + 1}: not a `[table] key` row: {lines[i]!r}"
        table = match["table"]
        if match["any"]:
            assert not match["key"] and not match["more"], f"docs/operations.md:{i + 1}: {cells[0]!r}"
            keys = ((table, ANY_OTHER_KEY),)
        else:
            assert match["key"], f"docs/operations.md:{i + 1}: a row of a table but no key: {cells[0]!r}"
            more = re.findall(r"`(\w+)`", match["more"])
            keys = tuple((table, key) for key in (match["key"], *more))
        rows.append(Row(i + 1, keys, cells[1]))
    # Rows cut off by a blank line render as a paragraph of pipes.
    stray = [f"docs/operations.md:{j + 1}: a key row outside the table (a blank line ends a Markdown table)"
             for j in range(i, end) if lines[j].startswith("| `[")]
    return rows, stray


def _doc_default(cell: str) -> tuple[bool, object]:
    """(True, value) for a cell that is one backticked literal: a TOML value, or else a
    bare word (a path, an address) taken as the string it spells; (False, None) for prose."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    if not match:
        return False, None
    try:
        return True, tomllib.loads(f"v = {match[1]}")["v"]
    except tomllib.TOMLDecodeError:
        return True, match[1]


def _same(a: object, b: object) -> bool:
    """Equal as a TOML reader sees them: 0 == 0.0, a list == a tuple, true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _show(default: object) -> str:
    if default is REQUIRED:
        return "required"
    if default is VARIES:
        return "depends on other keys"
    return repr(default)


def disagreements(reads: Reads, rows: list[Row], section: str) -> list[str]:
    """Everything where the section's table and the code's reads differ, one line each."""
    code = reads.keys()
    found, documented = [], {}
    for row in rows:
        for key in row.keys:
            if key in documented:
                found.append(f"{row}: [{key[0]}] {key[1]} has a row already, at {documented[key]}")
            documented[key] = row
    for table, key in sorted(set(code) - set(documented)):
        found.append(f"{section}: no row for [{table}] {key} (the code reads it; default {_show(code[table, key])})")
    for table in sorted(reads.rest):
        if (table, ANY_OTHER_KEY) not in documented:
            found.append(f"{section}: no row for `[{table}]` any other key (the code takes them as they are)")
    for row in rows:
        for table, key in row.keys:
            if key == ANY_OTHER_KEY:
                if table not in reads.rest:
                    found.append(f"{row}: `[{table}]` any other key: the code takes no other keys of [{table}]")
                continue
            if (table, key) not in code:
                found.append(f"{row}: [{table}] {key}: the code reads no such key")
                continue
            default = code[table, key]
            if (default is REQUIRED) != (row.default == "required"):
                found.append(f"{row}: [{table}] {key}: the docs say {row.default!r}, the code's default is "
                             f"{_show(default)}")
                continue
            literal, value = _doc_default(row.default)
            if literal and (default is VARIES or not _same(value, default)):
                found.append(f"{row}: [{table}] {key}: the docs' default is {row.default}, the code's is "
                             f"{_show(default)}")
    return found


def _check(reads: Reads, section: str, modules: tuple[str, ...]) -> None:
    unread = sorted(_literal_keys(modules) - {key for _, key in reads.keys()} - {key for _, key in reads.tables})
    assert not unread, (f"keys in peerd/settings/{', '.join(modules)} that no sample here reached: {unread}; "
                        "add a sample that turns on the condition they are read under")
    rows, stray = doc_rows(section)
    found = stray + disagreements(reads, rows, section.removeprefix("## "))
    assert not found, "docs/operations.md disagrees with the code:\n  " + "\n  ".join(found)


# --- the tests ----------------------------------------------------------------------


def test_daemon_config_table_matches_the_code(recorder, tmp_path):
    _check(_daemon_reads(recorder, tmp_path), DAEMON_SECTION, DAEMON_MODULES)


def test_job_file_table_matches_the_code(recorder):
    _check(_job_reads(recorder), JOB_SECTION, JOB_MODULES)


def test_the_check_sees_a_wrong_default_a_missing_row_and_a_row_too_many():
    reads = Reads(defaults={("job", "seed"): 0, ("job", "epochs"): 1.0, ("job", "name"): REQUIRED,
                            ("", "job"): {}},
                  tables={("", "job")}, rest={"optimizer"})
    rows = [Row(1, (("job", "seed"),), "`1`"), Row(2, (("job", "epochs"),), "`1`"),
            Row(3, (("job", "name"),), "`\"x\"`"), Row(4, (("job", "gone"),), "`0`")]
    found = disagreements(reads, rows, "S")
    assert found == [
        "S: no row for `[optimizer]` any other key (the code takes them as they are)",
        "docs/operations.md:1: [job] seed: the docs' default is `1`, the code's is 0",
        "docs/operations.md:3: [job] name: the docs say '`\"x\"`', the code's default is required",
        "docs/operations.md:4: [job] gone: the code reads no such key",
    ]
    assert disagreements(reads, rows[1:2] + [Row(5, (("job", "seed"),), "`0.0`"),
                                              Row(6, (("job", "name"),), "required"),
                                              Row(7, (("optimizer", ANY_OTHER_KEY),), "—")], "S") == []
