"""The job spec (JOB.toml): parse_job, load_job and the fingerprint."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import tomli_w

from peerd.errors import ConfigError
from peerd.settings.jobspec import TrainSpec, GossipSpec, JobSpec, OptimizerSpec, load_job, parse_job, with_code

REPO = Path(__file__).resolve().parents[2]
MNIST = Path(resources.files("peerd") / "examples" / "mnist.toml")
MNIST_TEXT = MNIST.read_text()
MNIST_DATA = tomllib.loads(MNIST_TEXT)
SRC = "JOB.toml"


def changed(table: str, key: str, value) -> str:
    data = copy.deepcopy(MNIST_DATA)
    data.setdefault(table, {})[key] = value
    return tomli_w.dumps(data)


def without(table: str, key: str) -> str:
    data = copy.deepcopy(MNIST_DATA)
    del data[table][key]
    return tomli_w.dumps(data)


# --- the built-in example ------------------------------------------------------------------


def test_mnist_example_is_valid():
    spec = parse_job(MNIST_TEXT, str(MNIST))
    assert spec == JobSpec(
        name="mnist-example",
        module="peerd.examples.mnist",
        chance=0.1,
        seed=0,
        init="shared",
        data_mode="shared",
        local_batch=32,
        epochs=12.0,
        eval_every_rounds=40,
        optimizer=OptimizerSpec(name="sgd", lr=0.05, schedule="cosine", reference_batch=96, ramp_steps=8,
                                options=(("momentum", 0.9), ("weight_decay", 0.0001))),
        train=TrainSpec(grad_clip_norm=3.0),
        gossip=GossipSpec(period_steps=1, segments=6, chunk_kib=1024,
                          deadline_floor_s=0.5, deadline_ceiling_s=10.0),
    )
    assert isinstance(spec.epochs, float)


def test_spec_is_frozen():
    spec = parse_job(MNIST_TEXT, SRC)
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_minimal_spec_gets_defaults():
    spec = parse_job('[job]\nname = "j"\nmodel = "m:f"\ndata = "d:g"\n', SRC)
    assert spec == JobSpec(name="j", model="m:f", data="d:g")
    assert spec.optimizer == OptimizerSpec() and spec.gossip == GossipSpec()


# --- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_32_hex():
    fp = parse_job(MNIST_TEXT, SRC).fingerprint
    assert re.fullmatch(r"[0-9a-f]{32}", fp)


def test_fingerprint_equal_for_same_text_and_ignores_source_and_comments():
    a = parse_job(MNIST_TEXT, "a/JOB.toml")
    b = parse_job(MNIST_TEXT, "b/other.toml")
    c = parse_job(tomli_w.dumps(MNIST_DATA), SRC)  # no comments, different layout
    assert a.fingerprint == b.fingerprint == c.fingerprint


def test_fingerprint_is_stable_across_processes():
    """No dependence on hash randomisation or process state: peers compare these over the wire."""
    here = parse_job(MNIST_TEXT, SRC).fingerprint
    code = ("import sys; from peerd.settings.jobspec import parse_job; "
            "print(parse_job(open(sys.argv[1]).read(), 'x').fingerprint)")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, str(MNIST)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == here


def test_fingerprint_same_when_defaults_are_explicit_or_omitted():
    explicit = parse_job(changed("gossip", "mode", "crossover"), SRC)
    assert explicit.fingerprint == parse_job(MNIST_TEXT, SRC).fingerprint
    minimal = '[job]\nname = "j"\nmodel = "m:f"\ndata = "d:g"\n'
    # The optimizer's own keywords are passed on as written (peerd does not know
    # every class's defaults), except SGD's momentum, whose default is peerd's.
    full = tomli_w.dumps({"job": {"name": "j", "model": "m:f", "data": "d:g", "seed": 0, "init": "shared", "data_mode": "shared",
                         "local_batch": 32, "epochs": 1.0, "eval_every_rounds": 100, "metric": "accuracy",
                         "metric_mode": "max"},
                 "optimizer": {"name": "SGD", "lr": 0.05, "momentum": 0.9, "schedule": "cosine", "warmup_steps": 0},
                 "gossip": {"period_steps": 1, "segments": 8, "chunk_kib": 1024,
                            "deadline_floor_s": 0.5, "deadline_ceiling_s": 10.0, "average_buffers": False},
                 "train": {"precision": "fp32", "grad_clip_norm": 0.0}})
    assert parse_job(minimal, SRC).fingerprint == parse_job(full, SRC).fingerprint


def test_fingerprint_same_for_int_or_float_spelling():
    assert parse_job(changed("job", "epochs", 12.0), SRC).fingerprint == parse_job(MNIST_TEXT, SRC).fingerprint


CHANGES = [
    ("job", "name", "mnist-other"),
    ("job", "module", "peerd.examples.other"),
    ("job", "model", "peerd.examples.mnist:make_other"),
    ("job", "data", "peerd.examples.mnist:other_data"),
    ("job", "metric", "loss"),
    ("job", "metric_mode", "min"),
    ("job", "drop_last", True),
    ("job", "seed", 1),
    ("job", "init", "per-peer"),
    ("job", "local_batch", 64),
    ("job", "epochs", 13),
    ("job", "epoch_chunks", 4),
    ("job", "eval_every_rounds", 41),
    ("job", "global_batch", 128),
    ("job", "min_local_batch", 2),
    ("job", "max_local_batch", 64),
    ("job", "rebalance_rounds", 5),
    ("job", "rebalance_threshold", 0.2),
    ("optimizer", "lr", 0.051),
    ("optimizer", "momentum", 0.95),
    ("optimizer", "weight_decay", 0.0),
    ("optimizer", "nesterov", True),
    ("optimizer", "name", "adamw"),
    ("optimizer", "warmup_steps", 100),
    ("optimizer", "scaling", "linear"),
    ("optimizer", "max_scale", 4.0),
    ("train", "precision", "bf16"),
    ("train", "grad_clip_norm", 1.0),  # the example's is 3.0
    ("gossip", "average_buffers", True),
    ("gossip", "overlap", True),
    ("gossip", "average_optimizer_state", True),
    ("optimizer", "schedule", "constant"),
    ("optimizer", "reference_batch", 64),
    ("optimizer", "ramp_steps", 4),
    ("gossip", "period_steps", 2),
    ("gossip", "mode", "hierarchical"),
    ("gossip", "group_size", 3),
    ("gossip", "wire", "fp16"),
    ("gossip", "clip_factor", 4.0),
    ("gossip", "segments", 7),
    ("gossip", "chunk_kib", 512),
    ("gossip", "deadline_floor_s", 0.25),
    ("gossip", "deadline_ceiling_s", 20.0),
    ("job", "data_mode", "local"),
    ("job", "step_model", "proportional"),  # the default "affine" is left out (test below)
    ("job", "files", ["helpers.py", "configs/"]),
    ("job", "code", "ab" * 32),
]


@pytest.mark.parametrize("table, key, value", CHANGES, ids=[f"{t}.{k}" for t, k, _ in CHANGES])
def test_fingerprint_changes_with_any_value(table, key, value):
    base = parse_job(MNIST_TEXT, SRC)
    other = parse_job(changed(table, key, value), SRC)
    assert other != base
    assert other.fingerprint != base.fingerprint


@pytest.mark.parametrize("extra, message", [
    ("global_batch = 4\nmin_local_batch = 8\n", "global_batch must be at least job.min_local_batch"),
    ("min_local_batch = 8\nmax_local_batch = 4\n", "max_local_batch must be 0 or at least"),
])
def test_inconsistent_batch_bounds_are_refused(extra, message):
    text = MNIST_TEXT.replace("local_batch = 32", "local_batch = 32\n" + extra, 1)
    with pytest.raises(ConfigError, match=message):
        parse_job(text, SRC)


def test_with_code_names_the_bundle_in_the_job_and_its_fingerprint():
    code = "0123456789abcdef" * 4
    spec = parse_job(with_code(MNIST_TEXT, code), SRC)
    base = parse_job(MNIST_TEXT, SRC)
    assert spec.code == code and dataclasses.replace(spec, code="") == base
    assert spec.fingerprint != base.fingerprint


@pytest.mark.parametrize("table, key, value, expect", [
    ("job", "code", "abc", "64 hex digits"),
    ("job", "code", "AB" * 32, "64 hex digits"),
    ("job", "files", ["../outside.py"], "inside its directory"),
    ("job", "files", ["/etc/passwd"], "inside its directory"),
    ("job", "files", "helpers.py", "a list of paths"),
])
def test_bad_files_and_code_are_refused(table, key, value, expect):
    with pytest.raises(ConfigError, match=expect):
        parse_job(changed(table, key, value), SRC)


def test_every_field_is_covered_by_changes():
    # [outer]'s keys: tests/settings/test_jobspec_outer.py
    tables = ("optimizer", "gossip", "outer", "train", "checkpoint", "data_loading", "log")
    fields = {f"job.{k}" for k in JobSpec.__dataclass_fields__ if k not in tables}
    fields |= {f"optimizer.{k}" for k in OptimizerSpec.__dataclass_fields__}
    fields |= {f"gossip.{k}" for k in GossipSpec.__dataclass_fields__}
    fields |= {f"train.{k}" for k in TrainSpec.__dataclass_fields__}
    covered = {f"{t}.{k}" for t, k, _ in CHANGES} | {"optimizer.options"}  # momentum, nesterov, ...
    # weighting is local mode's (test below); secret_file, min_peers,
    # start_timeout_s, chance and first_step_warning_s are left out of the
    # fingerprint on purpose (tests below); script and args exclude a job module
    # (test below).
    assert fields - covered == {"job.weighting", "job.secret_file", "job.script", "job.args", "job.min_peers",
                                "job.start_timeout_s", "job.chance", "job.first_step_warning_s"}


def test_the_chance_level_is_watched_not_trained_and_not_in_the_fingerprint():
    """[job] chance only arms the collapse watch's metric rule (peerd.core.health)."""
    base = parse_job(without("job", "chance"), SRC)
    assert base.chance is None
    for value in (0.1, 4.564, -1.0):
        spec = parse_job(changed("job", "chance", value), SRC)
        assert spec.chance == value and spec.fingerprint == base.fingerprint
    assert parse_job(MNIST_TEXT, SRC).fingerprint == base.fingerprint


@pytest.mark.parametrize("value, ok", [(0.5, True), (86400, True), (0, False), (-1, False), (86401, False)])
def test_the_first_step_warning_is_each_peers_own_and_bounded(value, ok):
    """[job] first_step_warning_s only times a log line and the phase shown."""
    base = parse_job(MNIST_TEXT, SRC)
    assert base.first_step_warning_s == 120.0
    if not ok:
        with pytest.raises(ConfigError, match="first_step_warning_s"):
            parse_job(changed("job", "first_step_warning_s", value), SRC)
        return
    spec = parse_job(changed("job", "first_step_warning_s", value), SRC)
    assert spec.first_step_warning_s == value and spec.fingerprint == base.fingerprint


def test_the_start_gate_is_each_peers_own_and_not_in_the_fingerprint():
    data = copy.deepcopy(MNIST_DATA)
    data["job"].update(min_peers=4, start_timeout_s=30.0)
    gated = parse_job(tomli_w.dumps(data), SRC)
    assert (gated.min_peers, gated.start_timeout_s) == (4, 30.0)
    assert gated.fingerprint == parse_job(MNIST_TEXT, SRC).fingerprint
    for key, bad in (("min_peers", 0), ("start_timeout_s", 0.0)):
        data["job"][key] = bad
        with pytest.raises(ConfigError, match=key):
            parse_job(tomli_w.dumps(data), SRC)
        data["job"][key] = 4 if key == "min_peers" else 30.0


def test_local_mode_weighting_is_in_the_fingerprint_and_shared_fingerprints_are_as_before():

    shared = parse_job(MNIST_TEXT, SRC)
    local = parse_job(changed("job", "data_mode", "local"), SRC)
    data = copy.deepcopy(MNIST_DATA)
    data["job"].update(data_mode="local", weighting="uniform")
    uniform = parse_job(tomli_w.dumps(data), SRC)
    assert local.weighting == "samples" and uniform.weighting == "uniform"
    assert len({shared.fingerprint, local.fingerprint, uniform.fingerprint}) == 3
    # A shared-data job's canonical form has no weighting, nor the default step_model,
    # nor empty files and code, nor the chance level: peers of before local mode, of
    # before the step model was a choice, and of before code travelled, still match.
    fields = dataclasses.asdict(shared)
    for key in ("secret_file", "checkpoint", "data_loading", "weighting", "step_model", "min_peers",
                "start_timeout_s", "log", "files", "code", "chance", "first_step_warning_s", "outer"):
        del fields[key]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert shared.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()[:32]


@pytest.mark.parametrize("table, key, value, message", [
    ("job", "weighting", "uniform", "weighting applies to data_mode = 'local' only"),
    ("data", "root", "/srv/data", "data.root applies to data_mode = 'local' only"),
])
def test_local_mode_keys_are_refused_with_shared_data(table, key, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_job(changed(table, key, value), SRC)


def test_data_root_is_the_jobs_own_or_the_daemons(tmp_path):
    data = copy.deepcopy(MNIST_DATA)
    data["job"]["data_mode"] = "local"
    spec = parse_job(tomli_w.dumps(data), SRC)
    assert spec.data_root(str(tmp_path), "/srv/data") == "/srv/data"
    data["data"] = {"root": "mine"}
    spec = parse_job(tomli_w.dumps(data), SRC)
    assert spec.data_root(str(tmp_path), "/srv/data") == str(tmp_path / "mine")
    assert spec.data_loading.root == "mine" and spec.fingerprint == parse_job(
        tomli_w.dumps({**data, "data": {"root": "/elsewhere"}}), SRC).fingerprint


def test_tensorboard_is_each_peers_own_relative_to_the_job_file_and_not_in_the_fingerprint(tmp_path):
    base = parse_job(MNIST_TEXT, SRC)
    assert base.log.tensorboard == "" and base.tensorboard_dir(str(tmp_path)) is None
    data = copy.deepcopy(MNIST_DATA)
    data["log"] = {"tensorboard": "runs/tb"}
    spec = parse_job(tomli_w.dumps(data), SRC)
    assert spec.fingerprint == base.fingerprint
    assert spec.tensorboard_dir(str(tmp_path)) == tmp_path / "runs" / "tb"
    data["log"] = {"tensorboard": "/srv/tb"}
    assert parse_job(tomli_w.dumps(data), SRC).tensorboard_dir("") == Path("/srv/tb")
    with pytest.raises(ConfigError, match="log.tensorboard 'runs/tb' is relative"):
        spec.tensorboard_dir("")  # joined by name without --dir: nothing to take it from
    for bad, message in (("", "log.tensorboard = ''"), (3, "log.tensorboard"), ("a\0b", "log.tensorboard")):
        data["log"] = {"tensorboard": bad}
        with pytest.raises(ConfigError, match=message):
            parse_job(tomli_w.dumps(data), SRC)
    data["log"] = {"tensorbord": "tb"}
    with pytest.raises(ConfigError, match="tensorbord"):
        parse_job(tomli_w.dumps(data), SRC)


def test_a_script_job_and_its_arguments_are_in_the_fingerprint():
    base = '[job]\nname = "s"\nscript = "train.py"\n'
    specs = [parse_job(base + extra, SRC) for extra in ("", 'args = ["--lr", "1"]\n', 'args = ["--lr", "2"]\n')]
    specs.append(parse_job(base.replace("train.py", "other.py"), SRC))
    assert len({s.fingerprint for s in specs}) == 4
    assert specs[1].args == ("--lr", "1") and specs[0].script_path("/jobs") == Path("/jobs/train.py")


@pytest.mark.parametrize("extra, message", [
    ('script = "train.py"\nmodule = "m"\n', "job.script runs the script's own loop; drop job.module"),
    ('module = "m"\nargs = ["x"]\n', "job.args are a script's arguments; set job.script too"),
    ('script = "train.sh"\n', "job.script = 'train.sh': expected the path of a Python script"),
    ("", "needs module = 'package.module' (the job module), model = 'module:callable', or script = 'train.py'"),
])
def test_script_jobs_are_checked(extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_job('[job]\nname = "s"\n' + extra, SRC)


def test_secret_file_is_not_in_the_fingerprint_and_resolves_next_to_the_job_file(tmp_path):
    base = parse_job(MNIST_TEXT, SRC)
    spec = parse_job(changed("job", "secret_file", "keys/job.secret"), SRC)
    assert spec.secret_file == "keys/job.secret" and spec.fingerprint == base.fingerprint
    assert spec.secret_path(str(tmp_path)) == tmp_path / "keys" / "job.secret"
    assert parse_job(changed("job", "secret_file", "/etc/peerd/x"), SRC).secret_path("") == Path("/etc/peerd/x")
    assert base.secret_path(str(tmp_path)) is None
    with pytest.raises(ConfigError, match="relative"):
        spec.secret_path("")
    with pytest.raises(ConfigError, match="secret_file"):
        parse_job(changed("job", "secret_file", ""), SRC)


def test_the_daemon_s_job_secret_stands_in_for_a_missing_one_only_when_joined_by_name(tmp_path):
    spec = parse_job(changed("job", "secret_file", "job.secret"), SRC)
    daemon = tmp_path / "daemon.secret"
    assert spec.secret_here(str(tmp_path), daemon) == tmp_path / "job.secret"  # a job file's: refused at join
    assert spec.secret_here(str(tmp_path), daemon, by_name=True) == daemon
    assert spec.secret_here("", daemon, by_name=True) == daemon
    assert spec.secret_here(str(tmp_path), None, by_name=True) == tmp_path / "job.secret"
    (tmp_path / "job.secret").write_text("x")
    assert spec.secret_here(str(tmp_path), daemon, by_name=True) == tmp_path / "job.secret"  # the job's own wins
    assert parse_job(MNIST_TEXT, SRC).secret_here(str(tmp_path), daemon) == daemon


def test_checkpoint_settings_are_read_and_left_out_of_the_fingerprint():
    base = parse_job(MNIST_TEXT, SRC)
    other = parse_job(MNIST_TEXT + "\n[checkpoint]\nevery_rounds = 25\nevery_s = 0\n", SRC)
    assert (other.checkpoint.every_rounds, other.checkpoint.every_s) == (25, 0.0)
    assert (base.checkpoint.every_rounds, base.checkpoint.every_s) == (0, 60.0)
    assert other.fingerprint == base.fingerprint
    with pytest.raises(ConfigError, match="checkpoint.every_rounds"):
        parse_job(MNIST_TEXT + "\n[checkpoint]\nevery_rounds = -1\n", SRC)


# --- required keys, names, entry points -------------------------------------------------------


@pytest.mark.parametrize("key", ["name"])
def test_required_keys(key):
    with pytest.raises(ConfigError) as info:
        parse_job(without("job", key), SRC)
    assert str(info.value).startswith(f"{SRC}: job.{key} is required")


def test_missing_job_table():
    with pytest.raises(ConfigError, match=r"JOB.toml: job\.name is required"):
        parse_job("[optimizer]\nlr = 0.1\n", SRC)


def test_empty_text():
    with pytest.raises(ConfigError, match="is required"):
        parse_job("", SRC)


@pytest.mark.parametrize("name", ["a", "A", "9lives", "mnist-example", "a.b_c-D", "x" * 63])
def test_good_names(name):
    assert parse_job(changed("job", "name", name), SRC).name == name


@pytest.mark.parametrize(
    "name", ["", "-lead", ".hidden", "_under", "has space", "a/b", "../up", "x" * 64, "naïve", "a:b"]
)
def test_bad_names(name):
    with pytest.raises(ConfigError) as info:
        parse_job(changed("job", "name", name), SRC)
    assert str(info.value).startswith(f"{SRC}: job.name = ")


@pytest.mark.parametrize("key, value", [("name", "mnist\n"), ("model", "peerd.examples.mnist:make_model\n")])
def test_trailing_newline_rejected(key, value):
    with pytest.raises(ConfigError, match=f"job.{key}"):
        parse_job(changed("job", key, value), SRC)


@pytest.mark.parametrize("entry", ["m:f", "pkg.mod:make", "_p._m:_f", "a1.b2:c3"])
def test_good_entry_points(entry):
    assert parse_job(changed("job", "model", entry), SRC).model == entry
    assert parse_job(changed("job", "data", entry), SRC).data == entry


@pytest.mark.parametrize(
    "entry", ["", "module", "module:", ":func", "mod:func.attr", "1mod:f", "mod:1f", "mod-x:f",
              "mod:f()", "mod::f", "mod:f:g", "mod /x:f", "mod.py:f"],
)
@pytest.mark.parametrize("key", ["model", "data"])
def test_bad_entry_points(key, entry):
    if entry == "mod.py:f":
        # 'mod.py' is a legal dotted module path (module 'py' in package 'mod'); not an error.
        assert getattr(parse_job(changed("job", key, entry), SRC), key) == entry
        return
    with pytest.raises(ConfigError) as info:
        parse_job(changed("job", key, entry), SRC)
    assert str(info.value).startswith(f"{SRC}: job.{key} = ")
    assert "module:callable" in str(info.value)


# --- unknown keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, key, where",
    [
        ("job", "nmae", "[job]"),
        ("gossip", "segment", "[gossip]"),
    ],
)
def test_unknown_nested_keys(table, key, where):
    with pytest.raises(ConfigError) as info:
        parse_job(changed(table, key, 1), SRC)
    message = str(info.value)
    assert message.startswith(f"{SRC}: {where} unknown key(s): ")
    assert key in message


@pytest.mark.parametrize("extra", ["[gosip]\nsegments = 4\n", "typo = 1\n"])
def test_unknown_top_level_keys(extra):
    text = (extra + MNIST_TEXT) if not extra.startswith("[") else (MNIST_TEXT + extra)
    with pytest.raises(ConfigError, match=r"^JOB\.toml: unknown key\(s\): (gosip|typo)$"):
        parse_job(text, SRC)


# --- out-of-range values and wrong types -----------------------------------------------------------


BAD = [
    ("optimizer", "momentum", 1.0),
    ("optimizer", "momentum", 1.5),
    ("optimizer", "momentum", -0.1),
    ("optimizer", "lr", 0.0),
    ("optimizer", "lr", -0.1),
    ("optimizer", "weight_decay", -0.001),
    ("optimizer", "name", "adam w"),
    ("optimizer", "schedule", "step"),
    ("optimizer", "scaling", "cubic"),
    ("optimizer", "max_scale", 0.5),
    ("optimizer", "betas", [0.9]),
    ("optimizer", "betas", [0.9, 1.0]),
    ("optimizer", "nesterov", 1),
    ("optimizer", "eps", 0),
    ("optimizer", "foreach", "x"),
    ("job", "metric_mode", "highest"),
    ("job", "module", "peerd/examples"),
    ("train", "precision", "fp8"),
    ("train", "grad_clip_norm", -1.0),
    ("optimizer", "schedule", "Cosine"),
    ("gossip", "segments", 0),
    ("gossip", "segments", 4097),
    ("gossip", "chunk_kib", 0),
    ("gossip", "chunk_kib", 3),
    ("gossip", "chunk_kib", 16385),
    ("gossip", "period_steps", 0),
    ("gossip", "mode", "sgp"),
    ("gossip", "mode", "Hierarchical"),
    ("gossip", "group_size", 0),
    ("gossip", "wire", "fp8"),
    ("gossip", "clip_factor", 0.5),
    ("gossip", "clip_factor", -1.0),
    ("gossip", "wire", 16),
    ("gossip", "deadline_floor_s", 0.0),
    ("gossip", "deadline_ceiling_s", -1.0),
    ("job", "init", "random"),
    ("job", "init", "per_peer"),
    ("job", "init", True),
    ("job", "data_mode", "sharded"),
    ("job", "data_mode", "Local"),
    ("job", "weighting", "by_speed"),
    ("job", "local_batch", 0),
    ("job", "local_batch", 65537),
    ("job", "epochs", 0),
    ("job", "epochs", -1.0),
    ("job", "eval_every_rounds", 0),
    ("job", "global_batch", -1),
    ("job", "min_local_batch", 0),
    ("job", "max_local_batch", -1),
    ("job", "rebalance_rounds", 0),
    ("job", "rebalance_threshold", -0.1),
    ("job", "epoch_chunks", 0),
    ("job", "epoch_chunks", 65537),
    ("job", "epoch_chunks", 2.0),
    ("job", "chance", 0),
    ("job", "chance", float("nan")),
    ("job", "chance", float("inf")),
    ("job", "chance", "0.1"),
    # wrong types
    ("job", "seed", "0"),
    ("job", "seed", 1.5),
    ("job", "local_batch", 32.0),
    ("job", "local_batch", True),
    ("job", "name", 5),
    ("optimizer", "lr", "0.05"),
    ("optimizer", "lr", True),
    ("optimizer", "nesterov", 1),
    ("optimizer", "nesterov", "true"),
    ("gossip", "segments", True),
    ("gossip", "segments", 6.0),
]


@pytest.mark.parametrize("table, key, value", BAD, ids=[f"{t}.{k}={v!r}" for t, k, v in BAD])
def test_bad_values_name_file_and_key(table, key, value):
    with pytest.raises(ConfigError) as info:
        parse_job(changed(table, key, value), "/jobs/JOB.toml")
    message = str(info.value)
    assert message.startswith(f"/jobs/JOB.toml: {table}.{key} = "), message
    assert "expected" in message


GOOD = [
    ("optimizer", "momentum", 0.0),
    ("optimizer", "momentum", 0.999),
    ("optimizer", "weight_decay", 0.0),
    ("optimizer", "schedule", "constant"),
    ("optimizer", "schedule", "linear"),
    ("optimizer", "reference_batch", 64),
    ("optimizer", "ramp_steps", 4),
    ("train", "precision", "fp16"),
    ("train", "grad_clip_norm", 0.5),
    ("gossip", "segments", 1),
    ("gossip", "segments", 4096),
    ("gossip", "mode", "hierarchical"),
    ("gossip", "mode", "whole"),
    ("gossip", "group_size", 1),
    ("gossip", "wire", "bf16"),
    ("gossip", "wire", "fp16"),
    ("gossip", "chunk_kib", 4),
    ("gossip", "chunk_kib", 16384),
    ("job", "local_batch", 1),
    ("job", "local_batch", 65536),
    ("job", "epochs", 0.5),
    ("job", "seed", -3),
    ("job", "init", "per-peer"),
    ("job", "global_batch", 0),
    ("job", "max_local_batch", 0),
    ("job", "rebalance_threshold", 0.0),
    ("job", "epoch_chunks", 1),
    ("job", "epoch_chunks", 65536),
]


@pytest.mark.parametrize("table, key, value", GOOD, ids=[f"{t}.{k}={v!r}" for t, k, v in GOOD])
def test_boundary_values_accepted(table, key, value):
    spec = parse_job(changed(table, key, value), SRC)
    part = spec if table == "job" else getattr(spec, table)
    if table == "optimizer" and key not in OptimizerSpec.__dataclass_fields__:
        assert part.kwargs[key] == value
    else:
        assert getattr(part, key) == value


def test_deadline_floor_above_ceiling():
    data = copy.deepcopy(MNIST_DATA)
    data["gossip"].update(deadline_floor_s=11.0, deadline_ceiling_s=10.0)
    with pytest.raises(ConfigError) as info:
        parse_job(tomli_w.dumps(data), SRC)
    message = str(info.value)
    assert message.startswith(f"{SRC}: ")
    assert "deadline_floor_s" in message and "deadline_ceiling_s" in message


def test_deadline_floor_above_default_ceiling():
    with pytest.raises(ConfigError, match="deadline_floor_s"):
        parse_job(tomli_w.dumps({**MNIST_DATA, "gossip": {"deadline_floor_s": 12}}), SRC)


def test_deadline_floor_equal_to_ceiling_is_fine():
    data = copy.deepcopy(MNIST_DATA)
    data["gossip"].update(deadline_floor_s=3.0, deadline_ceiling_s=3.0)
    assert parse_job(tomli_w.dumps(data), SRC).gossip.deadline_floor_s == 3.0


@pytest.mark.parametrize("text", ["job = 5\n", "[job]\nname = 'x'\n[[gossip]]\nsegments = 2\n"])
def test_tables_of_the_wrong_type(text):
    with pytest.raises(ConfigError, match="expected a table"):
        parse_job(text, SRC)


def test_invalid_toml_names_source():
    with pytest.raises(ConfigError) as info:
        parse_job("[job\nname = ", "/jobs/JOB.toml")
    assert str(info.value).startswith("/jobs/JOB.toml: not valid TOML")


# --- load_job ------------------------------------------------------------------------------------


def test_load_job_returns_spec_and_exact_text(tmp_path):
    path = tmp_path / "JOB.toml"
    path.write_text(MNIST_TEXT)
    spec, text = load_job(path)
    assert text == MNIST_TEXT
    assert spec == parse_job(MNIST_TEXT, SRC)


def test_load_job_errors_name_the_file(tmp_path):
    path = tmp_path / "JOB.toml"
    path.write_text(changed("gossip", "segments", 0))
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert str(info.value).startswith(f"{path}: gossip.segments = 0")


def test_load_job_missing_file(tmp_path):
    path = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "cannot read job file" in str(info.value)
    assert str(path) in str(info.value)


def test_load_job_directory(tmp_path):
    with pytest.raises(ConfigError, match="cannot read job file"):
        load_job(tmp_path)


def test_load_job_non_utf8(tmp_path):
    path = tmp_path / "JOB.toml"
    path.write_bytes(MNIST_TEXT.encode() + b'\n# \xff\n')
    with pytest.raises(ConfigError, match=str(path)):
        load_job(path)
