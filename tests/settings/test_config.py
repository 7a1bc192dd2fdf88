"""Daemon settings: parse_config / load_config, and `peerd check-config`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import peerd.settings.config as config_mod
from peerd.settings.config import DaemonConfig, load_config, parse_config
from peerd.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SRC = "peerd.toml"


def parse(text: str, source: str = SRC) -> DaemonConfig:
    return parse_config(tomllib.loads(textwrap.dedent(text)), source)


def write(tmp_path: Path, text: str, name: str = "peerd.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- defaults and every key --------------------------------------------------------


def test_empty_config_gives_defaults():
    config = parse_config({}, SRC)
    assert config == DaemonConfig()
    assert config.state_dir == Path("/var/lib/peerd")
    assert config.control_socket == Path("/run/peerd/control.sock")
    assert config.peer_id == ""
    assert config.host == "127.0.0.1"
    assert config.peer_port == 0
    assert config.locality == ""
    assert config.interfaces == ("127.0.0.1",)
    assert config.hello_interval_s == 1.0
    assert config.peer_timeout_s == 6.0
    assert (config.full_mesh_max, config.fanout) == (8, 3)
    assert config.worker_threads == 1
    assert config.restart_backoff_s == 1.0
    assert config.restart_backoff_max_s == 30.0
    assert (config.max_crashes, config.crash_window_s) == (5, 600.0)


def test_empty_tables_give_defaults():
    assert parse("[daemon]\n[discovery]\n[worker]\n") == DaemonConfig()


FULL = """
[daemon]
state_dir = "/srv/peerd/state"
control_socket = "/srv/peerd/ctl.sock"
peer_id = "lab-box-7"
host = "10.1.2.3"
peer_port = 7070
locality = "rack-b"
stop_timeout_s = 45

[discovery]
interfaces = ["10.1.2.3", "192.168.0.9"]
hello_interval_s = 2.5
peer_timeout_s = 12.0
zeroconf = false
seeds = ["10.9.0.1:7070", "[fd00::5]:7070"]

[worker]
threads = 4
restart_backoff_s = 0.25
restart_backoff_max_s = 8.0
max_crashes = 3
crash_window_s = 120

[metrics]
host = "127.0.0.1"
port = 9464

[log]
format = "json"
tensorboard = "/srv/tb"

[data]
root = "/srv/data"
"""


def test_every_key_is_read():
    config = parse(FULL)
    assert config == DaemonConfig(
        state_dir=Path("/srv/peerd/state"),
        control_socket=Path("/srv/peerd/ctl.sock"),
        peer_id="lab-box-7",
        host="10.1.2.3",
        peer_port=7070,
        locality="rack-b",
        interfaces=("10.1.2.3", "192.168.0.9"),
        hello_interval_s=2.5,
        peer_timeout_s=12.0,
        worker_threads=4,
        restart_backoff_s=0.25,
        restart_backoff_max_s=8.0,
        max_crashes=3,
        crash_window_s=120.0,
        stop_timeout_s=45.0,
        zeroconf=False,
        seeds=("10.9.0.1:7070", "[fd00::5]:7070"),
        metrics_host="127.0.0.1",
        metrics_port=9464,
        log_format="json",
        data_root=Path("/srv/data"),
        tensorboard=Path("/srv/tb"),
    )
    assert isinstance(config.state_dir, Path) and isinstance(config.control_socket, Path)
    assert isinstance(config.interfaces, tuple)


def test_config_is_frozen():
    config = parse_config({}, SRC)
    with pytest.raises(AttributeError):
        config.peer_port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "text, field, value",
    [
        ('[daemon]\nhost = "::1"', "host", "::1"),
        ('[daemon]\nhost = "0.0.0.0"', "host", "0.0.0.0"),
        ("[daemon]\npeer_port = 65535", "peer_port", 65535),
        ("[daemon]\npeer_port = 0", "peer_port", 0),
        ('[daemon]\npeer_id = "a"', "peer_id", "a"),
        (f'[daemon]\npeer_id = "{"x" * 63}"', "peer_id", "x" * 63),
        ('[discovery]\ninterfaces = ["all"]', "interfaces", ("all",)),
        ('[discovery]\ninterfaces = ["::1", "127.0.0.1"]', "interfaces", ("::1", "127.0.0.1")),
        ("[worker]\nthreads = 256", "worker_threads", 256),
        ("[worker]\nthreads = 1", "worker_threads", 1),
        ('[worker]\ndevice = "cuda:1"', "worker_devices", ("cuda:1",)),
        ('[worker]\ndevice = "cpu"', "worker_devices", ("cpu",)),
        ('[worker]\ndevices = ["cpu", "cpu"]', "worker_devices", ("cpu", "cpu")),
        ('[worker]\ndevices = ["cuda:0", "cuda:1"]', "worker_devices", ("cuda:0", "cuda:1")),
        ('[worker]\ndevices = "auto"', "worker_devices", ()),
        ('[worker]\ndevice = "cpu"\ndevices = ["cpu"]', "worker_devices", ("cpu",)),
        ("[worker]\nrestart_backoff_s = 1", "worker_devices", ("auto",)),
        ("[worker]\nslowdown = 1.0", "slowdown", 1.0),
        ("[worker]\nslowdown = 4", "slowdown", 4.0),
        ("[worker]\nslowdown = 4", "slowdown_clock", "wall"),
        ('[worker]\nslowdown_clock = "cpu"', "slowdown_clock", "cpu"),
    ],
)
def test_boundary_values_accepted(text, field, value):
    assert getattr(parse(text), field) == value


def test_int_accepted_for_float():
    config = parse("[discovery]\nhello_interval_s = 2\npeer_timeout_s = 10\n[worker]\nrestart_backoff_s = 3\n")
    assert config.hello_interval_s == 2.0 and isinstance(config.hello_interval_s, float)
    assert config.peer_timeout_s == 10.0 and isinstance(config.peer_timeout_s, float)
    assert config.restart_backoff_s == 3.0 and isinstance(config.restart_backoff_s, float)


# --- unknown keys --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, key",
    [
        ("typo = 1", "typo"),
        ("[deamon]\nhost = '127.0.0.1'", "deamon"),
        ("[daemon]\nhots = '127.0.0.1'", "hots"),
        ("[discovery]\nhello_interval = 1.0", "hello_interval"),
        ("[worker]\nthread = 2", "thread"),
    ],
)
def test_unknown_keys_are_reported(text, key):
    with pytest.raises(ConfigError, match="unknown key") as info:
        parse(text, "/etc/peerd/custom.toml")
    message = str(info.value)
    assert "/etc/peerd/custom.toml" in message
    assert key in message


@pytest.mark.parametrize("table", ["daemon", "discovery", "worker"])
def test_unknown_nested_key_names_its_table(table):
    with pytest.raises(ConfigError) as info:
        parse(f"[{table}]\nbogus_key = 1", SRC)
    message = str(info.value)
    assert message.startswith(f"{SRC}: ")
    assert f"[{table}]" in message and "bogus_key" in message


def test_several_unknown_keys_all_named():
    with pytest.raises(ConfigError) as info:
        parse("zeta = 1\nalpha = 2\n")
    assert "alpha, zeta" in str(info.value)


# --- wrong types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, key",
    [
        ('[daemon]\npeer_port = "8080"', "daemon.peer_port"),  # string for int
        ("[daemon]\npeer_port = true", "daemon.peer_port"),  # bool for int
        ("[daemon]\npeer_port = 80.0", "daemon.peer_port"),  # float for int
        ("[worker]\nthreads = true", "worker.threads"),
        ('[worker]\nthreads = "4"', "worker.threads"),
        ("[worker]\nthreads = 1.5", "worker.threads"),
        ('[discovery]\nhello_interval_s = "1"', "discovery.hello_interval_s"),  # string for float
        ("[discovery]\nhello_interval_s = true", "discovery.hello_interval_s"),  # bool for float
        ("[worker]\nrestart_backoff_max_s = false", "worker.restart_backoff_max_s"),
        ("[worker]\nmax_crashes = 2.5", "worker.max_crashes"),
        ('[worker]\ncrash_window_s = "10m"', "worker.crash_window_s"),
        ("[daemon]\nhost = 127", "daemon.host"),
        ("[daemon]\nstate_dir = 1", "daemon.state_dir"),
        ("[daemon]\ncontrol_socket = true", "daemon.control_socket"),
        ("[daemon]\npeer_id = 7", "daemon.peer_id"),
        ("[daemon]\nlocality = []", "daemon.locality"),
        ('[discovery]\ninterfaces = "127.0.0.1"', "discovery.interfaces"),
        ("daemon = 5", "daemon"),
        ('discovery = "x"', "discovery"),
        ("worker = [1]", "worker"),
    ],
)
def test_wrong_types_raise_naming_file_and_key(text, key):
    with pytest.raises(ConfigError) as info:
        parse(text, "/x/peerd.toml")
    message = str(info.value)
    assert message.startswith(f"/x/peerd.toml: {key} = "), message
    assert "expected" in message


# --- bad values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, key",
    [
        ('[daemon]\nhost = "not-an-ip"', "daemon.host"),
        ('[daemon]\nhost = "localhost"', "daemon.host"),
        ('[daemon]\nhost = "256.1.1.1"', "daemon.host"),
        ('[daemon]\nhost = ""', "daemon.host"),
        ("[daemon]\npeer_port = 65536", "daemon.peer_port"),
        ("[daemon]\npeer_port = -1", "daemon.peer_port"),
        ('[daemon]\npeer_id = "has space"', "daemon.peer_id"),
        ('[daemon]\npeer_id = "under_score"', "daemon.peer_id"),
        ('[daemon]\npeer_id = "bücher"', "daemon.peer_id"),  # every peer's Hello would refuse it
        (f'[daemon]\npeer_id = "{"x" * 64}"', "daemon.peer_id"),
        ('[discovery]\ninterfaces = ["eth0"]', "discovery.interfaces"),
        ('[discovery]\ninterfaces = ["127.0.0.1", "wlan0"]', "discovery.interfaces"),
        ("[discovery]\ninterfaces = []", "discovery.interfaces"),
        ("[discovery]\nhello_interval_s = 0", "discovery.hello_interval_s"),
        ("[discovery]\nhello_interval_s = -1.0", "discovery.hello_interval_s"),
        ("[discovery]\nhello_interval_s = nan", "discovery.hello_interval_s"),
        ("[discovery]\npeer_timeout_s = 0.0", "discovery.peer_timeout_s"),
        ("[discovery]\npeer_timeout_s = -5", "discovery.peer_timeout_s"),
        ("[discovery]\nfull_mesh_max = 0", "discovery.full_mesh_max"),
        ("[discovery]\nfanout = 0", "discovery.fanout"),
        ("[discovery]\nfanout = 1.5", "discovery.fanout"),
        ("[worker]\nrestart_backoff_s = 0", "worker.restart_backoff_s"),
        ("[worker]\nrestart_backoff_max_s = -0.5", "worker.restart_backoff_max_s"),
        ("[worker]\nmax_crashes = -1", "worker.max_crashes"),
        ("[worker]\ncrash_window_s = 0", "worker.crash_window_s"),
        ("[worker]\nthreads = 0", "worker.threads"),
        ('[worker]\ndevice = "gpu"', "worker.device"),
        ('[worker]\ndevice = "cuda:x"', "worker.device"),
        ("[worker]\ndevices = []", "worker.devices"),
        ('[worker]\ndevices = ["auto", "cpu"]', "worker.devices"),
        ('[worker]\ndevices = ["gpu"]', "worker.devices"),
        ('[worker]\ndevices = "cpu"', "worker.devices"),
        ("[worker]\ndevices = 2", "worker.devices"),
        ('[worker]\ndevices = ["cpu", 1]', "worker.devices"),
        ("[worker]\ndevices = [" + ", ".join(['"cpu"'] * 65) + "]", "worker.devices"),
        ("[worker]\nthreads = 257", "worker.threads"),
        ("[worker]\nslowdown = 0.5", "worker.slowdown"),
        ('[worker]\nslowdown = "2"', "worker.slowdown"),
        ('[worker]\nslowdown_clock = "process"', "worker.slowdown_clock"),
        ("[daemon]\nstop_timeout_s = 0", "daemon.stop_timeout_s"),
        ('[discovery]\nseeds = ["10.0.0.1"]', "discovery.seeds"),
        ('[discovery]\nseeds = ["host.example:80"]', "discovery.seeds"),
        ('[discovery]\nseeds = ["10.0.0.1:0"]', "discovery.seeds"),
        ('[discovery]\nseeds = ["10.0.0.1:70000"]', "discovery.seeds"),
        ("[discovery]\nseeds = [7070]", "discovery.seeds"),
        ("[metrics]\nport = 65536", "metrics.port"),
        ('[metrics]\nhost = "localhost"', "metrics.host"),
        ('[log]\nformat = "xml"', "log.format"),
        ('[availability]\nmode = "sometimes"', "availability.mode"),
        ("[availability]\ncpu_share = 0", "availability.cpu_share"),
        ("[availability]\nhold_off_s = -1", "availability.hold_off_s"),
        ("[availability]\ncheck_interval_s = 0.01", "availability.check_interval_s"),
        ('[availability]\nwindows = "22:00-07:00"', "availability.windows"),
        ('[availability]\ncommands = [""]', "availability.commands"),
    ],
)
def test_bad_values_raise_naming_file_and_key(text, key):
    with pytest.raises(ConfigError) as info:
        parse(text, "/x/peerd.toml")
    message = str(info.value)
    assert message.startswith(f"/x/peerd.toml: {key} = "), message
    assert "expected" in message


def test_a_shared_machine_is_configured_in_its_availability_table():
    config = parse('[availability]\nmode = "when-free"\nwindows = ["22:00-07:00", "Sat 00:00-Mon 07:00"]\n'
                   'cpu_share = 0.8\nhold_off_s = 300\ncheck_interval_s = 2\ncommands = ["matlab"]\n')
    a = config.availability
    assert (a.mode, a.cpu_share, a.hold_off_s, a.check_interval_s, a.commands) == (
        "when-free", 0.8, 300.0, 2.0, ("matlab",))
    assert [w.text for w in a.windows] == ["22:00-07:00", "Sat 00:00-Mon 07:00"]
    d = parse("").availability
    assert (d.mode, d.windows, d.cpu_share, d.hold_off_s, d.check_interval_s, d.commands) == (
        "always", (), 0.5, 120.0, 1.0, ())


def test_a_window_that_means_nothing_is_refused_naming_the_key_and_the_window():
    with pytest.raises(ConfigError, match=r"^/x/peerd.toml: availability.windows = .*'25:00-07:00'.*not a time"):
        parse('[availability]\nwindows = ["25:00-07:00"]', "/x/peerd.toml")


@pytest.mark.parametrize("devices", ['["cuda:0", "cuda:1"]', '"auto"', '["cpu"]'])
def test_device_and_devices_that_disagree_are_refused(devices):
    with pytest.raises(ConfigError, match="worker.device = 'cuda:0' and worker.devices = .* disagree"):
        parse(f'[worker]\ndevice = "cuda:0"\ndevices = {devices}', "/x/peerd.toml")


@pytest.mark.parametrize(
    "hello, timeout",
    [(1.0, 2.0), (1.0, 1.5), (2.0, 4.0), (3.0, None), (1.0, 0.5)],  # None: default timeout 6.0
)
def test_peer_timeout_must_exceed_twice_hello(hello, timeout):
    text = f"[discovery]\nhello_interval_s = {hello}\n"
    if timeout is not None:
        text += f"peer_timeout_s = {timeout}\n"
    with pytest.raises(ConfigError) as info:
        parse(text, "/x/peerd.toml")
    message = str(info.value)
    assert "/x/peerd.toml" in message
    assert "peer_timeout_s" in message and "hello_interval_s" in message


def test_peer_timeout_just_above_twice_hello_is_fine():
    config = parse("[discovery]\nhello_interval_s = 1.0\npeer_timeout_s = 2.01\n")
    assert config.peer_timeout_s == 2.01


@pytest.mark.parametrize("value", ["[1]", "[true]"])
def test_interfaces_must_be_strings(value):
    with pytest.raises(ConfigError, match="discovery.interfaces"):
        parse(f"[discovery]\ninterfaces = {value}\n")


# --- load_config ----------------------------------------------------------------------


def test_load_config_reads_file(tmp_path):
    path = write(tmp_path, FULL)
    assert load_config(path) == parse(FULL)


def test_load_config_errors_name_the_file(tmp_path):
    path = write(tmp_path, "[daemon]\npeer_port = 99999\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: daemon.peer_port = 99999")


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "[daemon\nhost = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML")
    assert "\n" not in message


def test_duplicate_key_is_invalid_toml(tmp_path):
    path = write(tmp_path, "[daemon]\nhost = '127.0.0.1'\nhost = '10.0.0.1'\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_missing_file_raises_config_error(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "cannot read" in str(info.value)


def test_directory_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_non_utf8_file_raises_config_error(tmp_path):
    path = tmp_path / "peerd.toml"
    path.write_bytes(b'[daemon]\nlocality = "\xff"\n')
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)


def test_load_config_none_without_default_file_gives_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", tmp_path / "absent.toml")
    assert load_config(None) == DaemonConfig()


def test_load_config_none_reads_default_file(tmp_path, monkeypatch):
    path = write(tmp_path, "[daemon]\nlocality = 'lab-3'\n")
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", path)
    assert load_config(None).locality == "lab-3"


def test_load_config_none_reports_default_file_errors(tmp_path, monkeypatch):
    path = write(tmp_path, "[daemon]\nbogus = 1\n")
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", path)
    with pytest.raises(ConfigError, match="bogus") as info:
        load_config(None)
    assert str(path) in str(info.value)


# --- peerd check-config ------------------------------------------------------------------
# All CLI runs start together in one module fixture (each is a full interpreter start).

BAD_CLI = {
    "port": ("[daemon]\npeer_port = 70000\n", "daemon.peer_port"),
    "unknown": ("[worker]\nthreadz = 2\n", "threadz"),
    "timeout": ("[discovery]\nhello_interval_s = 5\n", "peer_timeout_s"),
    "toml": ("[daemon\n", "not valid TOML"),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    d = tmp_path_factory.mktemp("check-config")
    good = write(d, FULL, "good.toml")
    files = {name: write(d, text, f"{name}.toml") for name, (text, _) in BAD_CLI.items()}
    calls = {
        "good": (["--config", str(good), "check-config"], good),
        **{name: (["--config", str(path), "check-config"], path) for name, path in files.items()},
        "missing": (["--config", str(d / "absent.toml"), "check-config"], d / "absent.toml"),
        "documented good": (["check-config", "--config", str(good)], good),
        "documented bad": (["check-config", "--config", str(files["port"])], files["port"]),
        "no config": (["check-config"], config_mod.DEFAULT_PATH),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
    procs = {name: subprocess.Popen([sys.executable, "-m", "peerd.cli.daemon", *args], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (args, _) in calls.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        results[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err), calls[name][1])
    return results


def test_check_config_good_file(cli):
    result, path = cli["good"]
    assert result.returncode == 0, result.stderr
    assert f"{path}: valid" in result.stdout


@pytest.mark.parametrize("name", BAD_CLI)
def test_check_config_bad_file(cli, name):
    result, path = cli[name]
    key = BAD_CLI[name][1]
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"peerd: {path}")
    assert key in lines[0]
    assert "valid" not in result.stdout


def test_check_config_missing_file(cli):
    result, path = cli["missing"]
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert str(path) in result.stderr


def test_check_config_documented_order_good_file(cli):
    result, path = cli["documented good"]
    assert result.returncode == 0, result.stderr
    assert f"{path}: valid" in result.stdout


def test_check_config_documented_order_bad_file(cli):
    result, _ = cli["documented bad"]
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "daemon.peer_port" in lines[0]


@pytest.mark.skipif(config_mod.DEFAULT_PATH.exists(), reason="a real default config exists here")
def test_check_config_without_file_does_not_claim_absent_file_valid(cli):
    result, path = cli["no config"]
    assert result.returncode == 0
    assert f"{path}: valid" not in result.stdout


# --- environment overrides -------------------------------------------------------------


def test_environment_overrides_the_file(tmp_path):
    path = write(tmp_path, FULL)
    env = {"PEERD_PEER_ID": "box-9", "PEERD_HOST": "10.0.0.9", "PEERD_LOCALITY": "rack-z",
           "PEERD_METRICS_PORT": "0", "PEERD_SEEDS": "10.0.0.1:7070, 10.0.0.2:7070"}
    config = load_config(path, env)
    assert (config.peer_id, config.host, config.locality, config.metrics_port) == ("box-9", "10.0.0.9", "rack-z", 0)
    assert config.seeds == ("10.0.0.1:7070", "10.0.0.2:7070")
    assert config.hello_interval_s == 2.5  # the rest still comes from the file
    assert load_config(path, {"PEERD_PEER_ID": ""}).peer_id == "lab-box-7"  # empty: not set
    assert load_config(path, {"PEERD_DATA_ROOT": "/mnt/scans"}).data_root == Path("/mnt/scans")


def test_a_relative_data_root_is_taken_from_the_config_files_directory(tmp_path):
    assert load_config(write(tmp_path, '[data]\nroot = "data"\n'), {}).data_root == tmp_path / "data"


def test_tensorboard_is_off_by_default_and_relative_to_the_config_files_directory(tmp_path):
    assert DaemonConfig().tensorboard is None
    assert load_config(write(tmp_path, '[log]\ntensorboard = "tb"\n'), {}).tensorboard == tmp_path / "tb"
    for bad in ('""', "1", "true"):
        with pytest.raises(ConfigError, match="log.tensorboard"):
            parse(f"[log]\ntensorboard = {bad}\n")


def test_check_config_says_where_the_curves_go_or_that_tensorboard_is_missing(monkeypatch):
    import importlib.util

    from peerd.cli.daemon import _tensorboard_lines

    assert _tensorboard_lines(DaemonConfig()) == []
    config = DaemonConfig(tensorboard=Path("/srv/tb"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert _tensorboard_lines(config) == [
        "log.tensorboard = /srv/tb: each job's curves in /srv/tb/JOB/MEMBER (a job's own [log] tensorboard wins); "
        "watch them with `tensorboard --logdir /srv/tb`"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert _tensorboard_lines(config) == [
        "log.tensorboard = /srv/tb: the tensorboard package is not installed: the workers train without "
        "TensorBoard logs (pip install peerd[tensorboard])"]


def test_check_config_says_what_a_shared_machine_watches(monkeypatch):
    import importlib.util

    from peerd.cli.daemon import _availability_lines

    assert _availability_lines(DaemonConfig(), 0) == []
    nightly = parse('[availability]\nwindows = ["22:00-07:00"]')
    assert _availability_lines(nightly, 0) == ["availability: trains only within 22:00-07:00 (local time)"]
    free = parse('[availability]\nmode = "when-free"\ncommands = ["matlab"]')
    assert _availability_lines(free, 0) == [
        "availability: trains while no other process of matlab above 0.5 cores, after 120s free"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "nvidia-ml-py is not installed: its 2 GPU(s) are not watched" in _availability_lines(free, 2)[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert _availability_lines(free, 2) == [
        "availability: trains while no other process of matlab on its 2 GPU(s), after 120s free"]


def test_peerd_config_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", tmp_path / "absent.toml")
    path = write(tmp_path, "[daemon]\npeer_port = 7071\n", "other.toml")
    assert load_config(None, {"PEERD_CONFIG": str(path)}).peer_port == 7071
    assert load_config(None, {}).peer_port == 0
    assert load_config(write(tmp_path, "", "explicit.toml"), {"PEERD_CONFIG": str(path)}).peer_port == 0


@pytest.mark.parametrize("name, value", [
    ("PEERD_PEER_ID", "has space"), ("PEERD_HOST", "localhost"), ("PEERD_METRICS_PORT", "x"),
    ("PEERD_METRICS_PORT", "70000"), ("PEERD_SEEDS", "10.0.0.1"),
])
def test_a_bad_environment_value_names_the_variable(name, value):
    with pytest.raises(ConfigError) as info:
        load_config(None, {name: value, "PEERD_CONFIG": ""})
    assert name in str(info.value) and "expected" in str(info.value)


def test_check_config_reads_peerd_config(tmp_path):
    path = write(tmp_path, "[daemon]\npeer_port = 99999\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}, "PEERD_CONFIG": str(path)}
    out = subprocess.run([sys.executable, "-m", "peerd.cli.daemon", "check-config"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith(f"peerd: {path}: daemon.peer_port = 99999")


# --- host = "auto" -----------------------------------------------------------------------


def test_host_auto_is_kept_in_the_config_and_discovery_follows_it():
    config = parse('[daemon]\nhost = "auto"\n')
    assert (config.host, config.interfaces) == ("auto", ("auto",))


def test_discovery_set_by_hand_does_not_follow_an_auto_host():
    config = parse('[daemon]\nhost = "auto"\n[discovery]\ninterfaces = ["all"]\n')
    assert config.interfaces == ("all",)


def test_discovery_left_unset_speaks_on_a_fixed_lan_host_and_stays_on_loopback_otherwise():
    # A daemon serving on the LAN while mDNS spoke on loopback would never be found.
    assert parse('[daemon]\nhost = "10.1.2.3"\n').interfaces == ("10.1.2.3",)
    assert parse('[daemon]\nhost = "10.1.2.3"\n[discovery]\ninterfaces = ["127.0.0.1"]\n').interfaces == (
        "127.0.0.1",)
    for host in ("127.0.0.1", "0.0.0.0", "::1"):
        assert parse(f'[daemon]\nhost = "{host}"\n').interfaces == ("127.0.0.1",), host


def test_peerd_host_auto_makes_the_files_host_auto_and_discovery_follows(tmp_path):
    path = write(tmp_path, '[daemon]\nhost = "10.1.2.3"\n')
    config = load_config(path, {"PEERD_HOST": "auto"})
    assert (config.host, config.interfaces) == ("auto", ("auto",))


def test_a_bad_host_says_auto_is_allowed():
    with pytest.raises(ConfigError, match='daemon.host = .*"auto"'):
        parse('[daemon]\nhost = "Auto"\n')


def fake_network(monkeypatch, route: str | None, pairs: list[tuple[str, str]]) -> None:
    monkeypatch.setattr(config_mod, "_route_address", lambda: route)
    monkeypatch.setattr(config_mod, "_interface_addresses", lambda: pairs)


def test_resolving_auto_gives_a_copy_with_the_picked_address_for_host_and_discovery(monkeypatch):
    fake_network(monkeypatch, "10.1.2.3", [("lo", "127.0.0.1"), ("eth0", "10.1.2.3")])
    config = parse('[daemon]\nhost = "auto"\n')
    resolved, pick = config_mod.resolve_host(config)
    assert (resolved.host, resolved.interfaces) == ("10.1.2.3", ("10.1.2.3",))
    assert pick.describe() == "10.1.2.3 (eth0, the default route's interface)"
    assert config.host == "auto"  # the config itself keeps "auto"


def test_resolving_keeps_discovery_set_by_hand(monkeypatch):
    fake_network(monkeypatch, "10.1.2.3", [])
    config = parse('[daemon]\nhost = "auto"\n[discovery]\ninterfaces = ["all"]\n')
    assert config_mod.resolve_host(config)[0].interfaces == ("all",)


def test_resolving_a_fixed_host_looks_nothing_up(monkeypatch):
    monkeypatch.setattr(config_mod, "_route_address", lambda: pytest.fail("looked up"))
    config = parse('[daemon]\nhost = "10.1.2.3"\n')
    assert config_mod.resolve_host(config) == (config, None)


def test_resolving_auto_without_an_answer_is_a_config_error(monkeypatch):
    fake_network(monkeypatch, None, [("eth0", "10.1.2.3"), ("eth1", "10.4.5.6")])
    with pytest.raises(ConfigError, match=r"10\.1\.2\.3 \(eth0\), 10\.4\.5\.6 \(eth1\); set daemon.host"):
        config_mod.resolve_host(parse('[daemon]\nhost = "auto"\n'))


def test_the_interface_lister_gives_ipv4_pairs_with_loopback():
    pairs = config_mod._interface_addresses()
    assert "127.0.0.1" in [address for _, address in pairs]
    assert all(":" not in address for _, address in pairs)
