"""The JSON scripts read (docs/operations.md, "JSON output"): `peerctl --json`
against a real daemon in this test's loop, and the page's `/api/status`, parsed
with the standard json module as strict JSON: counters are ints, a value not
known is null, never a string."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from google.protobuf import wrappers_pb2

from peerd.cli import peerctl
from peerd.core.codes import WorkerState
from peerd.control.jsonform import _float_json, message_json
from peerd.control.progress import empty_progress
from peerd.proto.v1 import control_pb2

from conftest import example_job, free_port, until

INTS = {"int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64"}


def strict(text: str | bytes) -> dict:
    """json.loads that refuses NaN and Infinity, as jq and most parsers do."""
    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


async def peerctl_json(capsys, daemon, *argv: str) -> dict:
    # The sync gRPC client in a thread: the daemon answers on this loop.
    code = await asyncio.to_thread(peerctl.main, ["--socket", str(daemon.config.control_socket), "--json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return strict(out)


async def http_get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.partition(b"\r\n\r\n")[2]


def assert_types(message, data: dict) -> None:
    """Every field by its .proto type, nested and repeated ones and fields added later included."""
    for field in message.DESCRIPTOR.fields:
        value, proto = data[field.name], getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert sorted(value) == sorted(str(k) for k in proto), field.name
            for k, v in proto.items():
                _check(field.message_type.fields_by_name["value"], v, value[str(k)])
        elif field.is_repeated:
            assert len(value) == len(proto), field.name
            for v, shown in zip(proto, value):
                _check(field, v, shown)
        else:
            _check(field, proto, value)


def _check(field, proto, value) -> None:
    kind = _type_name(field)
    if kind == "message":
        assert value is None or isinstance(value, dict), (field.name, value)
        if value is not None:
            assert_types(proto, value)
    elif kind in INTS:
        assert type(value) is int, (field.name, value)
    elif kind in ("double", "float"):
        assert value is None or type(value) is float, (field.name, value)


def _type_name(field) -> str:
    names = {getattr(field, k): k[5:].lower() for k in dir(field) if k.startswith("TYPE_")}
    return names[field.type]


async def test_peerctl_json_and_the_page_print_numbers_and_null(daemons, capsys):
    port = free_port()
    alpha = await daemons("alpha", metrics_port=port)
    beta = await daemons("beta", seeds=(alpha.peer_address,))
    alpha.registry.join(example_job(job={"name": "j"}), "", start=False)
    worker = alpha.registry.jobs["j"].first
    worker.state = WorkerState.RUNNING  # advertised as running; no process started
    worker.progress = empty_progress()  # share NaN: a fixed batch
    worker.progress.MergeFrom(control_pb2.Progress(
        step=603, round=2**40, samples=2**53 + 1, loss=0.25, phase="training", global_batch=64))
    worker.progress.rejected["bad_mac"] = 3
    worker.progress.exchange_buckets.extend([1, 2])

    status = await peerctl_json(capsys, alpha, "status")
    [job] = status["jobs"]
    p = job["progress"]
    assert p["step"] == 603 and p["step"] > 100 and p["round"] == 2**40 and p["samples"] == 2**53 + 1
    assert p["share"] is None and p["metric"] is None and p["loss"] == 0.25 and p["compute_s"] == 0.0
    assert p["rejected"] == {"bad_mac": 3} and p["exchange_buckets"] == [1, 2]
    assert job["workers"][0]["progress"] == p and type(status["uptime_s"]) is float
    assert_types(alpha.status(), status)

    await until(lambda: beta.list_peers().peers and beta.list_peers().peers[0].job_states, "beta to hear of j")
    [peer] = (await peerctl_json(capsys, beta, "peers"))["peers"]
    [shown] = peer["job_states"]
    assert shown["round"] == 2**40 and shown["share"] is None and shown["loss"] == 0.25
    assert_types(beta.list_peers().peers[0], peer)

    page = strict(await http_get(port, "/api/status?points=5"))
    assert page["status"]["jobs"] == status["jobs"] and type(page["status"]["peers_known"]) is int
    assert page["jobs"] == await peerctl_json(capsys, alpha, "jobs")
    [member] = page["view"][0]["members"]
    assert member["round"] == 2**40 and member["share"] is None


def test_the_json_form_follows_the_descriptors():
    """Any field, one added later too: 64-bit integers as ints, non-finite floats
    and unset messages as null, maps with string keys."""
    p = empty_progress()
    p.MergeFrom(control_pb2.Progress(step=2**63, lr=math.inf, disagreement=-math.inf))
    p.metrics["accuracy"] = math.nan
    data = message_json(control_pb2.LocalWorker(member="m", progress=p))
    assert data["progress"]["step"] == 2**63 and data["progress"]["lr"] is None
    assert data["progress"]["disagreement"] is None and data["progress"]["metrics"] == {"accuracy": None}
    assert message_json(control_pb2.LocalWorker(member="m"))["progress"] is None
    assert strict(json.dumps(data, allow_nan=False)) == data
    assert_types(control_pb2.LocalWorker(member="m", progress=p), data)


@pytest.mark.parametrize("value, shown", [(0.1, 0.1), (1 / 3, 0.33333334), (2.5, 2.5), (math.nan, None)])
def test_a_single_precision_float_prints_as_its_shortest_form(value, shown):
    stored = wrappers_pb2.FloatValue(value=value).value  # a float field: float32 widened to a double
    assert _float_json(stored, single=True) == shown
