"""Which samples this peer reads, and a DataLoader that reads them ahead.

`DataCursor` is the position in the job's data: epoch, chunk, this peer's part
of the chunk and how far it has read it (the re-split rules of
peerd.core.partition). `PeerSampler` turns it into a batch sampler for a
torch DataLoader, so loading (in worker processes, pinned, prefetched) overlaps
the compute while the split, the DBS shares and the re-split at chunk
boundaries stay exactly what the cursor decides. The sampler notes, for every
batch it hands out, where the cursor stood after it: the trainer counts
progress by the batches it trained on, not by the ones prefetched.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from peerd.core.partition import chunk_at, chunk_bounds, epoch_permutation, part_bounds
from peerd.core.shares import BatchPlan
from peerd.settings.jobspec import JobSpec


class DataCursor:
    def __init__(self, spec: JobSpec, peer_id: str, samples: int) -> None:
        self.spec = spec
        self.peer_id = peer_id
        self.bounds = chunk_bounds(samples, spec.epoch_chunks)
        self.epoch = 0
        self._perm: tuple[int, list[int]] = (-1, [])  # (epoch, its permutation)
        self.chunk = -1  # the chunk of the epoch being read; -1: none yet
        self.part: list[int] = []  # this peer's part of it
        self.pos = 0  # samples of the part read
        self.share = math.nan  # this peer's part of the current chunk's data (DBS), NaN when equal

    @property
    def progress(self) -> float:
        """Epochs done, fractional: the position reached in the epoch's
        permutation, inside a chunk in proportion to this peer's part read."""
        if self.chunk < 0:
            return float(self.epoch)
        start, stop = self.bounds[self.chunk], self.bounds[self.chunk + 1]
        read = self.pos / len(self.part) if self.part else 1.0
        return self.epoch + (start + (stop - start) * read) / self.bounds[-1]

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs

    def take(self, size: int, members: Sequence[str], plan: BatchPlan | None) -> list[int]:
        """Up to `size` indices: the rest of this peer's part of the current
        chunk, then its parts of the next chunks, into the next epoch. A batch
        spans chunks and epochs, so only the job's last batch may be short: an
        epoch's end is no change of the global batch (the LR law) and no small
        batch for BatchNorm's statistics (docs/algorithms.md, "Epoch ends")."""
        batch: list[int] = []
        while len(batch) < size and not self.done:
            if self.pos < len(self.part):
                taken = self.part[self.pos : self.pos + size - len(batch)]
                self.pos += len(taken)
                batch += taken
            elif self.chunk + 1 < self.spec.epoch_chunks:
                self._start_chunk(self.chunk + 1, members, plan)
            else:
                self.epoch, self.chunk, self.part, self.pos = self.epoch + 1, -1, [], 0
        return batch

    def _start_chunk(self, chunk: int, members: Sequence[str], plan: BatchPlan | None) -> None:
        """Take this peer's part of `chunk`, split among the members (and by the
        DBS plan's shares) seen now; a part may be empty when peers outnumber
        the chunk's samples."""
        if self._perm[0] != self.epoch:
            self._perm = (self.epoch, epoch_permutation(self.bounds[-1], self.spec.name, self.epoch))
        shares = plan.shares() if plan is not None else None
        self.share = shares[self.peer_id] if shares else math.nan
        start, stop = part_bounds(self.bounds[chunk], self.bounds[chunk + 1],
                                  plan.ids if plan is not None else members, self.peer_id, shares)
        self.chunk, self.part, self.pos = chunk, self._perm[1][start:stop], 0

    def seek(self, progress: float) -> None:
        """Go on at the first chunk boundary at or after `progress` (a donor's
        position): the chunk under way may have been split without this peer,
        so reading in it could read samples twice. The others count this peer
        from the first chunk they start after it serves (docs/algorithms.md,
        "Data partition")."""
        self.epoch = int(progress)
        self.chunk = chunk_at(self.bounds, progress - self.epoch) - 1
        self.part, self.pos = [], 0


@dataclass(frozen=True)
class Micro:
    """What the sampler knew of a micro-batch when it handed it out."""

    indices: list[int]
    step_size: int  # samples in the whole step it belongs to
    last: bool  # the step's last micro-batch
    progress: float  # the cursor's position after it
    epoch: int
    share: float


@dataclass
class View:
    """The membership a step is planned for; the training loop updates it."""

    members: Sequence[str] = ()
    plan: BatchPlan | None = None


class PeerSampler(Sampler[list[int]]):
    """Yields this peer's micro-batches (index lists) until the job is done."""

    def __init__(self, cursor: DataCursor, view: View, batch_size: Callable[[View], int], micro: int) -> None:
        self.cursor = cursor
        self.view = view
        self.batch_size = batch_size
        self.micro = micro  # 0: a step is one forward pass
        self.handed: deque[Micro] = deque()
        self.on_hand: Callable[[deque[Micro]], None] | None = None  # told of each batch handed out

    def __len__(self) -> int:
        """The batches still to come, estimated from the members and batch of
        now (the membership may change: for progress bars and the like)."""
        left = max(0.0, self.cursor.spec.epochs - self.cursor.progress) * self.cursor.bounds[-1]
        members = max(1, len(self.view.members))
        return math.ceil(left / members / max(1, self.batch_size(self.view)))

    def __iter__(self) -> Iterator[list[int]]:
        while not self.cursor.done:
            size = self.batch_size(self.view)
            indices = self.cursor.take(size, self.view.members, self.view.plan)
            if not indices:
                return
            if len(indices) < size and (self.cursor.spec.drop_last or len(indices) == 1):
                continue  # the job's short last batch: read, not trained on (one sample cannot train BatchNorm)
            step = self.micro or len(indices)
            for start in range(0, len(indices), step):
                part = indices[start : start + step]
                c = self.cursor
                self.handed.append(Micro(part, len(indices), start + step >= len(indices),
                                         c.progress, c.epoch, c.share))
                if self.on_hand is not None:
                    self.on_hand(self.handed)
                yield part


class _Batched(Dataset):
    """A TensorDataset indexed a whole batch at a time (DataLoader uses
    __getitems__ when a dataset has it): one gather per tensor, not one
    Python call and one stack per sample."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.tensors = dataset.tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int):
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices, dtype=torch.long)
        return tuple(t[index] for t in self.tensors)


def _as_is(batch):
    return batch


def default_loader(dataset: Dataset, batch_sampler: Sampler, workers: int, pin: bool, prefetch: int,
                   cls: type[DataLoader] = DataLoader) -> DataLoader:
    """A DataLoader (`cls`) as the PyTorch docs advise for an accelerator: worker
    processes kept for the whole job, pinned memory, a few batches ahead."""
    fast = isinstance(dataset, TensorDataset)
    options = dict(num_workers=workers, pin_memory=pin)
    if workers:
        # The worker process serves gRPC: forking it is unsafe, a forkserver is not.
        options.update(persistent_workers=True, prefetch_factor=prefetch, multiprocessing_context="forkserver")
    return cls(_Batched(dataset) if fast else dataset, batch_sampler=batch_sampler,
               collate_fn=_as_is if fast else None, **options)


def eval_loader(dataset: Dataset, batch: int) -> DataLoader:
    """The test set in order, `batch` samples at a time."""
    if isinstance(dataset, TensorDataset):
        return DataLoader(_Batched(dataset), batch_sampler=_Sequential(len(dataset), batch), collate_fn=_as_is)
    return DataLoader(dataset, batch_size=batch)


class _Sequential(Sampler[list[int]]):
    def __init__(self, n: int, batch: int) -> None:
        self.n, self.batch = n, batch

    def __iter__(self) -> Iterator[list[int]]:
        for start in range(0, self.n, self.batch):
            yield list(range(start, min(start + self.batch, self.n)))

    def __len__(self) -> int:
        return -(-self.n // self.batch)
