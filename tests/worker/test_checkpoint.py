"""Checkpoints: atomic files with a checksum; bad ones are reported and skipped."""

from __future__ import annotations

import logging

import pytest
import torch

from peerd.worker.state.checkpoint import CheckpointDir, CheckpointError, decode, encode
from peerd.worker.state.pull import StateMeta

N = 1000


def state(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def ckpts(tmp_path) -> CheckpointDir:
    return CheckpointDir(tmp_path / "checkpoints", "job", "fp-1", N)


def test_save_then_load_gives_the_same_state(ckpts):
    vector = state(1)
    ckpts.save(StateMeta(7, 70, 0.25), vector)
    loaded = ckpts.load_newest()
    assert loaded.meta == StateMeta(7, 70, 0.25)
    assert torch.equal(loaded.vector, vector)


def test_only_the_newest_two_are_kept_and_no_temp_file_is_left(ckpts):
    for r in (1, 2, 3, 4):
        ckpts.save(StateMeta(r, r * 10, r / 10), state(r))
    assert [p.name for p in ckpts.files()] == ["ckpt-0000000004.peerd", "ckpt-0000000003.peerd"]
    assert sorted(p.name for p in ckpts.path.iterdir()) == ["ckpt-0000000003.peerd", "ckpt-0000000004.peerd"]
    assert ckpts.load_newest().meta.round == 4


def _flip(path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["payload-start", "payload-end", "header"])
def test_a_flipped_bit_is_detected_and_the_older_checkpoint_loaded(ckpts, caplog, where):
    ckpts.save(StateMeta(1, 10, 0.1), state(1))
    newest = ckpts.save(StateMeta(2, 20, 0.2), state(2))
    size = newest.stat().st_size
    position = {"payload-start": size - 4 * N, "payload-end": size - 1, "header": 30}[where]
    _flip(newest, position)
    with caplog.at_level(logging.WARNING):
        loaded = ckpts.load_newest()
    assert loaded.meta.round == 1 and torch.equal(loaded.vector, state(1))
    assert any(newest.name in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("keep_bytes", [0, 5, 40, -1, -4 * N])
def test_a_truncated_checkpoint_is_skipped(ckpts, caplog, keep_bytes):
    ckpts.save(StateMeta(1, 10, 0.1), state(1))
    newest = ckpts.save(StateMeta(2, 20, 0.2), state(2))
    data = newest.read_bytes()
    newest.write_bytes(data[:keep_bytes] if keep_bytes >= 0 else data[:len(data) + keep_bytes])
    with caplog.at_level(logging.WARNING):
        assert ckpts.load_newest().meta.round == 1
    assert any("skipped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("job, fingerprint, numel", [("other", "fp-1", N), ("job", "fp-2", N), ("job", "fp-1", N + 1)])
def test_a_checkpoint_of_another_job_fingerprint_or_size_is_skipped(tmp_path, job, fingerprint, numel):
    CheckpointDir(tmp_path, job, fingerprint, numel).save(StateMeta(5, 50, 0.5), torch.zeros(numel))
    assert CheckpointDir(tmp_path, "job", "fp-1", N).load_newest() is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_never_loaded(bad):
    vector = state(1)
    vector[17] = bad
    data = encode("job", "fp-1", StateMeta(1, 1, 0.0), vector)  # a valid checksum over bad values
    with pytest.raises(CheckpointError, match="non-finite"):
        decode(data, "job", "fp-1", N)


def test_huge_finite_values_whose_sum_overflows_still_load(ckpts):
    vector = torch.full((N,), 3e38)
    ckpts.save(StateMeta(1, 1, 0.0), vector)
    assert torch.equal(ckpts.load_newest().vector, vector)


def test_garbage_and_foreign_files_are_ignored_or_skipped(ckpts):
    ckpts.path.mkdir(parents=True)
    (ckpts.path / "ckpt-0000000009.peerd").write_bytes(b"not a checkpoint at all")
    (ckpts.path / "notes.txt").write_text("hello")
    (ckpts.path / ".ckpt-0000000010.peerd.tmp").write_bytes(b"PEERDCK1\n{")  # a write that never finished
    assert ckpts.load_newest() is None
    ckpts.save(StateMeta(3, 30, 0.3), state(3))
    assert ckpts.load_newest().meta.round == 3


def test_no_directory_means_no_checkpoint(tmp_path):
    assert CheckpointDir(tmp_path / "absent", "job", "fp", N).load_newest() is None


def test_a_checkpoint_is_verified_from_its_own_header(ckpts):
    from peerd.worker.state.checkpoint import verify_checkpoint

    path = ckpts.save(StateMeta(7, 70, 1.5), state(1))
    assert verify_checkpoint(path) == StateMeta(7, 70, 1.5)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        verify_checkpoint(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a peerd checkpoint"):
        verify_checkpoint(path)
