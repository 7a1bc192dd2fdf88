"""peerd.transformers' pieces that need no daemon (docs/operations.md,
"Hugging Face Trainer"; peerd.worker.train.trainerjob): the Trainer's length
against the job's, the job's position as the Trainer's global_step and the
intervals it passes, the Trainer's batches over peerd's sampler, what an
evaluation hands peerd; and the module itself: its import without
transformers, and a daemon that never imports it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest
import torch

from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.worker.train.data import DataCursor, PeerSampler, View
from peerd.worker.train.scriptsource import total_steps
from peerd.worker.train.trainerjob import JobBatches, check_length, due, job_step, model_metrics, rows, split


def script_spec(epochs: float, chunks: int = 4):
    return parse_job(f'[job]\nname = "t"\nscript = "s.py"\nepochs = {epochs}\nepoch_chunks = {chunks}\n', "test")


def test_num_train_epochs_must_be_the_jobs_epochs():
    check_length(2.0, 2, -1, 1000, 32)
    check_length(2.5, 2.5, 0, 1000, 32)
    with pytest.raises(ConfigError, match=r"TrainingArguments\(num_train_epochs=3\) and the job's \[job\] "
                                          r"epochs = 2 differ"):
        check_length(2.0, 3, -1, 1000, 32)


def test_max_steps_must_be_the_steps_of_the_jobs_epochs_and_the_refusal_gives_both_fixes():
    check_length(2.0, 3.0, 63, 1000, 32)  # ceil(2 × 1000 / 32): num_train_epochs is not read then
    with pytest.raises(ConfigError) as refused:
        check_length(2.0, 3.0, 100, 1000, 32)
    message = str(refused.value)
    assert "max_steps=100" in message and "is 63 steps" in message and "max_steps = 63" in message, message
    fit = float(re.search(r"set \[job\] epochs = ([0-9.]+)", message).group(1))
    assert total_steps(fit, 1000, 32) == 100  # the epochs it offers make the Trainer's 100 steps
    check_length(fit, 3.0, 100, 1000, 32)


def test_the_global_step_is_the_jobs_position_in_one_processs_steps():
    # 2 epochs of 50 steps: half an epoch in, the job is at step 25, whatever this peer took.
    assert job_step(0.5, 2, 100, 10, False) == 25
    assert job_step(0.01, 2, 100, 10, False) == 11  # every step a new number, never behind
    assert job_step(0.2, 2, 100, 30, False) == 31
    assert job_step(2.0, 2, 100, 90, False) == 99  # the end only once the job is done here
    assert job_step(1.97, 2, 100, 90, True) == 100
    steps, at = [], 0
    for k in range(1, 40):  # two peers: the job moves two steps per step of this one
        at = job_step(k * 2 / 50, 2, 100, at, k * 2 >= 100)
        steps.append(at)
    assert steps == list(range(2, 80, 2))


def test_the_intervals_a_move_of_several_steps_passes():
    every = {"log": 10, "evaluate": 5, "save": 0}
    assert due(8, 12, every) == ["log", "evaluate"]
    assert due(10, 14, every) == []
    assert due(14, 15, every) == ["evaluate"]
    assert due(0, 40, {"log": 0}) == []


def test_a_step_is_cut_into_its_micro_batches():
    assert split(list(range(32)), 2) == [list(range(16)), list(range(16, 32))]
    assert split(list(range(5)), 2) == [[0, 1], [2, 3, 4]]  # the job's short last step
    assert split([7], 2) == [[7]]  # never an empty one
    assert split(list(range(6)), 1) == [list(range(6))]


def _peer_batches(spec, peer: str, members: list[str], by_epoch: bool = True):
    cursor = DataCursor(spec, peer, 100)
    sampler = PeerSampler(cursor, View(members=members), lambda view: 16, 0)  # optimizer steps of 8 × 2
    batches = JobBatches(100, 8, 2, by_epoch=by_epoch)
    batches.start(sampler)
    return batches, cursor, sampler


@pytest.mark.parametrize("members", [["a", "b"], ["a"]])
def test_the_trainers_epochs_are_the_jobs_and_together_the_peers_read_every_sample_once_per_epoch(members):
    spec = script_spec(epochs=2)
    read = Counter()
    for peer in members:
        batches, cursor, sampler = _peer_batches(spec, peer, members)
        assert len(batches) == 14  # one process's micro-batches per epoch in whole steps: ceil(ceil(100 / 8) / 2) × 2
        pieces = []
        for epoch in range(2):  # the Trainer's own epochs: ceil(num_train_epochs)
            these = list(batches)
            assert 0 < len(these) <= len(batches)  # within the Trainer's epoch: it trains all it is handed
            assert len(these) % 2 == 0 or cursor.done  # whole optimizer steps
            assert epoch + 1 <= cursor.progress < epoch + 1 + 16 * len(members) / 100  # ends with the job's epoch
            pieces += these
        assert list(batches) == [] and cursor.done  # the job is over here
        steps = [m.indices for m in sampler.handed]
        assert [i for p in pieces for i in p] == [i for s in steps for i in s]  # the steps, cut in two
        read.update(i for s in steps for i in s)
    assert set(read) == set(range(100)) and set(read.values()) == {2}


def test_a_trainer_of_max_steps_is_handed_at_most_an_epoch_of_its_own_at_a_time():
    spec = script_spec(epochs=2.5)
    batches, cursor, sampler = _peer_batches(spec, "a", ["a"], by_epoch=False)
    handed = []
    while not cursor.done:
        these = list(batches)
        assert len(these) == len(batches) or cursor.done
        handed += these
    assert sum(len(p) for p in handed) == 250


def test_batches_read_before_the_job_is_joined_are_refused_and_a_job_over_gives_none():
    batches = JobBatches(100, 8, 2)
    with pytest.raises(ConfigError, match="read before the Trainer joined the job"):
        list(batches)
    batches.start([])  # peer.loader() of a job already over here
    assert list(batches) == []


def test_what_an_evaluation_and_a_batch_hand_peerd():
    evaluated = {"eval_loss": 2.5, "eval_accuracy": 0.5, "eval_runtime": 0.1, "eval_samples_per_second": 900.0,
                 "eval_steps_per_second": 9.0, "epoch": 2.0, "eval_note": "text"}
    assert model_metrics(evaluated) == {"eval_loss": 2.5, "eval_accuracy": 0.5}
    ids = torch.zeros(6, 64, dtype=torch.long)
    assert rows({"attention_mask": torch.ones(6, 64), "input_ids": ids}) == 6
    assert rows({"pixel_values": torch.zeros(3, 1, 8, 8), "labels": torch.zeros(3)}) == 3
    assert rows((ids, ids)) == 6 and rows({"n": 3}) is None


def test_without_transformers_the_import_says_what_to_install():
    # In a fresh interpreter: a None in sys.modules makes an import fail as if the package were not installed.
    for missing in ("transformers", "accelerate"):
        code = f"import sys; sys.modules[{missing!r}] = None; import peerd.transformers"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0, out
        assert ("ImportError: peerd.transformers needs Hugging Face transformers and accelerate: "
                "pip install peerd[transformers]") in out.stderr, out.stderr


def test_inside_the_module_transformers_is_the_real_package_and_the_daemon_never_imports_it():
    import transformers

    import peerd.transformers

    inside = peerd.transformers.transformers
    assert inside.__name__ == "transformers" and inside.__file__ == transformers.__file__
    assert issubclass(peerd.transformers.Trainer, transformers.Trainer)
    code = ("import sys, peerd.cli.daemon, peerd.daemon.app, peerd.worker.main; "
            "print(sorted(m for m in sys.modules if m.split('.')[-1] == 'transformers'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out
