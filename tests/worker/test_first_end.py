"""The first end is the job's (docs/algorithms.md, "One model at the end"): at
its end a worker asks its daemon whether a member ended the job before it with
another consensus, and takes that model. The members asked are those in the
view at the end and those it saw leave: a member that ended first has left the
view, and a worker whose daemon was frozen through that end may see nobody else
at its own."""

from __future__ import annotations

import json
import types

import torch
from torch import nn

from peerd.core.lifecycle import Event
from peerd.proto.v1 import control_pb2
from peerd.worker.ending import JobEnd


class Link:
    """The daemon's side of the question: what it was asked, and its answer."""

    def __init__(self, reply: control_pb2.ResultReply) -> None:
        self.reply, self.asked = reply, []

    async def take_result(self, fingerprint: str, members: list[str], timeout_s: float, digest: str):
        self.asked.append((fingerprint, members, digest))
        return self.reply


def engine(tmp_path, reply: control_pb2.ResultReply, left: set[str]):
    model = nn.Linear(3, 1)
    return types.SimpleNamespace(me="peer-1", left=left, link=Link(reply), out_dir=tmp_path,
                                 identity=types.SimpleNamespace(fingerprint="fp"),
                                 spec=types.SimpleNamespace(metric="accuracy"),
                                 state=types.SimpleNamespace(model=model))


async def test_a_member_that_left_the_view_is_asked_and_its_end_taken_into_the_model(tmp_path):
    theirs = nn.Linear(3, 1)
    torch.save(theirs.state_dict(), tmp_path / "model.pt")  # what the daemon wrote, taken from peer-0
    record = {"consensus": ["peer-0"], "consensus_digest": "aa", "metrics": {"consensus_accuracy": 0.97}}
    e = engine(tmp_path, control_pb2.ResultReply(outcome="taken", from_peer="peer-0", record=json.dumps(record)),
               left={"peer-0"})
    end = JobEnd(e)  # nobody else in the view at the end: end._asked is empty

    ended = await end._first_end(types.SimpleNamespace(digest="bb"))

    assert e.link.asked == [("fp", ["peer-0"], "bb")]
    assert ended.event == Event.TAKEN and ended.metrics["consensus_accuracy"] == 0.97
    for mine, taken in zip(e.state.model.parameters(), theirs.parameters()):
        assert torch.equal(mine, taken)  # the job's model, in the worker's own module


async def test_the_view_at_the_end_and_the_members_that_left_are_asked_once_each(tmp_path):
    e = engine(tmp_path, control_pb2.ResultReply(outcome="same", from_peer="peer-2"), left={"peer-0", "peer-1"})
    end = JobEnd(e)
    end._asked = {"peer-2", "peer-0"}

    assert await end._first_end(types.SimpleNamespace(digest="cc")) is None  # the same model: its own end stands
    assert e.link.asked == [("fp", ["peer-0", "peer-2"], "cc")]  # not itself, though it once left and came back


async def test_alone_from_start_to_end_nobody_is_asked(tmp_path):
    e = engine(tmp_path, control_pb2.ResultReply(outcome="taken"), left=set())
    assert await JobEnd(e)._first_end(types.SimpleNamespace(digest="dd")) is None
    assert e.link.asked == []
