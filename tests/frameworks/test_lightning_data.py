"""peerd.lightning's training loader and position in a real Lightning Trainer,
without a daemon: peerd's sampler (over a DataCursor, as peer.loader makes it)
under the Trainer's loader, wired in the hooks Peerd uses; peerd's own
bookkeeping of the steps handed out stands for peer.step(). A Lightning epoch
is the job's epoch, a newcomer starts at the job's position without losing a
batch, and a loader the Trainer reads before the job is joined is made again."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

pl = pytest.importorskip("lightning.pytorch")

from lightning_module import (ACCUMULATE, BATCH, CHUNKS, EPOCHS, GAMMA, LR, ME, MEMBERS, N, SPEC,  # noqa: E402
                              Tiny, data)
from peerd.core.partition import chunk_at, chunk_bounds, epoch_permutation, part_bounds  # noqa: E402
from peerd.errors import ConfigError  # noqa: E402
from peerd.lightning import _follow_schedules, _schedule_of, _TrainData  # noqa: E402
from peerd.worker.train.data import DataCursor, PeerSampler, View  # noqa: E402


class Joined(pl.Callback):
    """_TrainData in the hooks Peerd calls it from, joined at `progress`."""

    def __init__(self, progress: float = 0.0) -> None:
        self.progress = progress
        self.cursor = DataCursor(SPEC, ME, N)
        if progress > 0:
            self.cursor.seek(progress)  # as peer.loader's cursor of a peer holding the job's state at `progress`
        self.sampler: PeerSampler | None = None
        self.trained: dict[int, list[int]] = defaultdict(list)  # sample indices by the Trainer's epoch
        self.validated: list[int] = []
        self.steps_at_start = None

    def setup(self, trainer, pl_module, stage):
        self.data = _TrainData(trainer, SPEC.epochs)

    def teardown(self, trainer, pl_module, stage):
        self.data.close()

    def on_fit_start(self, trainer, pl_module):
        self.schedules = [(_schedule_of(k, c), c.scheduler) for k, c in enumerate(trainer.lr_scheduler_configs)]
        self.data.bind(self.peers_sampler, lambda: False)

    def peers_sampler(self, dataset, step_batch):
        self.sampler = PeerSampler(self.cursor, View(MEMBERS), lambda view: step_batch, 0)
        return self.sampler

    def on_train_start(self, trainer, pl_module):
        self.data.start(self.progress)
        self.steps_at_start = trainer.global_step
        _follow_schedules(trainer, self.schedules, self.data.scale)

    def on_train_epoch_start(self, trainer, pl_module):
        _follow_schedules(trainer, self.schedules, self.data.scale)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.data.taken(batch_idx)
        self.trained[trainer.current_epoch] += batch[2].tolist()
        self.before = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.before:
            return
        step = self.sampler.handed.popleft()  # what peer.step() counts: the step's samples, the position after
        assert self.data.stepped() == len(step.indices)
        self.progress = step.progress
        self.data.at(self.progress)
        _follow_schedules(trainer, self.schedules, self.data.scale)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated.append(trainer.current_epoch)


def fit(module: Tiny, joined: Joined, **options) -> pl.Trainer:
    trainer = pl.Trainer(**{"max_epochs": EPOCHS, "accelerator": "cpu", "devices": 1, "logger": False,
                            "enable_checkpointing": False, "enable_progress_bar": False,
                            "enable_model_summary": False, "accumulate_grad_batches": ACCUMULATE,
                            "callbacks": [joined], **options})
    trainer.fit(module)
    return trainer


def my_part(epoch: int, first_chunk: int = 0) -> list[int]:
    """This peer's samples of the job's `epoch` from `first_chunk` on, from the partition's own rules."""
    order, bounds = epoch_permutation(N, SPEC.name, epoch), chunk_bounds(N, CHUNKS)
    parts = [part_bounds(bounds[c], bounds[c + 1], list(MEMBERS), ME, None) for c in range(first_chunk, CHUNKS)]
    return sorted(i for start, stop in parts for i in order[start:stop])


def test_each_lightning_epoch_trains_this_peers_part_of_the_jobs_epoch_and_validates_at_its_end():
    module, joined = Tiny(), Joined()
    trainer = fit(module, joined)
    assert sorted(joined.trained) == list(range(EPOCHS))
    for epoch, indices in joined.trained.items():
        assert sorted(indices) == my_part(epoch), epoch  # each once, nothing of another epoch
    assert joined.validated == list(range(EPOCHS))
    assert sorted(set(module.used)) == [(e, pytest.approx(LR * GAMMA ** e)) for e in range(EPOCHS)]
    # This peer took half the steps; global_step is the job's position: one process's 1024 / 32 per epoch.
    assert len(module.used) == EPOCHS * N // 2 // (BATCH * ACCUMULATE)
    assert trainer.global_step == EPOCHS * N // (BATCH * ACCUMULATE) and trainer.current_epoch == EPOCHS
    assert not joined.sampler.handed and joined.cursor.done


# peerd.attach steps the optimizer once first (its state made up front); here nothing does.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_newcomer_starts_at_the_jobs_epoch_and_position_and_trains_every_batch_it_was_handed(workers):
    """At 1.3 epochs: from the next chunk of epoch 1 on. The Trainer makes the
    loader's iterator twice before that epoch's first batch (once when it sets
    the data up, once at the epoch's start): the steps read by the first (one
    ahead, or each DataLoader worker's prefetch) are trained from the second,
    not lost."""
    loader = {"num_workers": workers, "persistent_workers": True} if workers else {}
    module, joined = Tiny(loader=loader), Joined(progress=1.3)
    trainer = fit(module, joined)
    if workers:
        assert type(trainer.train_dataloader.multiprocessing_context).__name__ == "ForkServerContext"
    first = chunk_at(chunk_bounds(N, CHUNKS), 0.3)
    assert sorted(joined.trained) == [1, 2]
    assert sorted(joined.trained[1]) == my_part(1, first) and sorted(joined.trained[2]) == my_part(2)
    # global_step is one process's steps to where this peer starts reading: the boundary of that chunk.
    assert joined.steps_at_start == math.floor((1 + first / CHUNKS) * N / (BATCH * ACCUMULATE)) == 44
    # The fresh StepLR (as a donor's before its epoch-end step) is moved to the job's epoch.
    assert sorted(set(module.used)) == [(1, pytest.approx(LR * GAMMA)), (2, pytest.approx(LR * GAMMA ** 2))]
    assert joined.validated == [1, 2] and trainer.global_step == EPOCHS * N // (BATCH * ACCUMULATE)
    assert not joined.sampler.handed and joined.cursor.done


def test_a_loader_read_for_estimated_stepping_batches_is_one_process_and_made_again_over_peerds_sampler():
    module, joined = Tiny(schedule="step"), Joined()
    trainer = fit(module, joined)
    # One process's optimizer steps, as alone: the length of a schedule peerd moves along the job.
    assert module.estimated == EPOCHS * math.ceil(math.ceil(N / BATCH) / ACCUMULATE) == 96
    assert all(sorted(joined.trained[e]) == my_part(e) for e in range(EPOCHS))
    onecycle = trainer.lr_scheduler_configs[0].scheduler
    assert onecycle.last_epoch == trainer.global_step == 96  # the schedule's end with the job's, never past it
    lrs = [lr for _, lr in module.used]
    assert max(lrs) == pytest.approx(LR, rel=0.05) and lrs[-1] < LR / 100  # the whole cycle, in half the steps


@pytest.mark.parametrize("loader, says", [
    (dict(batch_size=1, batch_sampler=[[0, 1]]), "give the training DataLoader a batch_size"),
    (dict(dataset=None), "over a map-style dataset"),
])
def test_a_training_loader_peerd_cannot_split_is_refused(loader, says):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(data())

    if "dataset" in loader:
        module = Tiny()
        module.train_dataloader = lambda: DataLoader(Stream(), batch_size=BATCH)
    else:
        module = Tiny(loader={"shuffle": False, **loader})
    with pytest.raises(ConfigError, match=says):
        fit(module, Joined())


def test_the_loaders_options_are_kept_and_val_loaders_are_left_as_they_are():
    seen = {}

    class Look(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["train"], seen["val"] = trainer.train_dataloader, trainer.val_dataloaders

    def collate(batch):
        return torch.utils.data.default_collate(batch)

    generator = torch.Generator()
    module = Tiny(loader={"collate_fn": collate, "generator": generator, "shuffle": False})
    joined = Joined()
    fit(module, joined, callbacks=[joined, Look()])
    train = seen["train"]
    assert train.collate_fn is collate and train.generator is generator and len(train.dataset) == N
    assert type(train.batch_sampler).__name__ == "EpochBatches"
    assert type(seen["val"].batch_sampler).__name__ == "BatchSampler"
