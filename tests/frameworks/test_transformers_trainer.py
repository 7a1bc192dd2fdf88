"""peerd.transformers.Trainer without a daemon (docs/operations.md, "Hugging
Face Trainer"): outside a job it says how to run it; in one (a Launch set, as
the worker sets it) its training loader is the Trainer's data over peerd's
sampler, what a job cannot take is refused before anything is joined, and what
a newcomer and a checkpoint take carries the Trainer's position, LR schedule
and optimizer, with a GPT-2's head tied to its embedding."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from peerd.control.launch import Launch, set_launch
from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job
from peerd.transformers import Trainer, registered, torch_optimizer
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.optim import init_state
from peerd.worker.train.trainerjob import JobBatches

VOCAB, CONTEXT = 32, 16


class Ids(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, CONTEXT), generator=torch.Generator().manual_seed(n))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Stream(IterableDataset):
    def __iter__(self):
        yield from Ids(4)


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=CONTEXT,
                                      bos_token_id=0, eos_token_id=0))


def trainer(tmp_path, dataset=None, **arguments) -> Trainer:
    options = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, gradient_accumulation_steps=2,
                   num_train_epochs=2, report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no")
    args = TrainingArguments(**{**options, **arguments})
    return Trainer(model=gpt2(), args=args, train_dataset=Ids(100) if dataset is None else dataset)


@pytest.fixture
def in_job(tmp_path):
    """A Launch as the worker sets it before a script runs: `in_job(epochs=2, ...)`."""

    def launch(device: str = "cpu", **job) -> None:
        text = "".join(f"{k} = {v}\n" for k, v in {"epochs": 2, **job}.items())
        spec = parse_job(f'[job]\nname = "t"\nscript = "s.py"\n{text}', "test")
        set_launch(Launch(spec, "", "unix:/nonexistent", "a", out_dir=tmp_path, device=device))

    yield launch
    set_launch(None)


def test_outside_a_peerd_job_train_says_how_to_run_it(tmp_path):
    with pytest.raises(ConfigError, match=r"not started by peerd; run it as a script job"):
        trainer(tmp_path).train()


def test_the_training_loader_is_the_trainers_data_and_collator_over_peerds_sampler(tmp_path, in_job):
    in_job(epochs=2)
    loader = trainer(tmp_path).get_train_dataloader()
    assert isinstance(loader.batch_sampler, JobBatches) and loader.batch_sampler.step_batch == 16
    assert len(loader) == 14  # one process's micro-batches per epoch, whole steps: the Trainer's arithmetic
    batch = loader.collate_fn([Ids(100)[0], Ids(100)[1]])
    assert batch["input_ids"].shape == (2, CONTEXT)  # the Trainer's collator


@pytest.mark.parametrize("arguments, job, message", [
    ({"num_train_epochs": 3}, {}, r"num_train_epochs=3\) and the job's \[job\] epochs = 2 differ"),
    ({"max_steps": 20}, {}, r"max_steps=20\) does not match the job: .* is 13 steps"),
])
def test_a_trainer_of_another_length_than_the_job_is_refused(tmp_path, in_job, arguments, job, message):
    in_job(**job)
    with pytest.raises(ConfigError, match=message):
        trainer(tmp_path, **arguments).get_train_dataloader()


def test_a_dataset_peerd_cannot_split_is_refused(tmp_path, in_job):
    in_job()
    with pytest.raises(ConfigError, match="an IterableDataset cannot be split"):
        trainer(tmp_path, dataset=Stream(), max_steps=4).get_train_dataloader()


@pytest.mark.parametrize("arguments, job, train, message", [
    ({}, {}, {"resume_from_checkpoint": "out/checkpoint-5"}, "drop resume_from_checkpoint"),
    ({"auto_find_batch_size": True}, {}, {}, "drop auto_find_batch_size"),
    ({}, {"global_batch": 64}, {}, r"set \[job\] global_batch = 0"),
])
def test_what_a_job_cannot_take_is_refused_before_joining(tmp_path, in_job, arguments, job, train, message):
    in_job(**job)
    with pytest.raises(ConfigError, match=message):
        trainer(tmp_path, **arguments).train(**train)


def _state(t: Trainer) -> TrainState:
    """The training state peerd.attach makes of a Trainer (its optimizer's state made up front)."""
    t.create_optimizer_and_scheduler(num_training_steps=100)
    optimizer = torch_optimizer(t.optimizer)
    init_state(optimizer)
    return TrainState(t.model, optimizer, objects=registered(t, t.lr_scheduler))


def test_a_newcomer_takes_the_trainers_position_schedule_and_optimizer_and_the_head_stays_tied(tmp_path):
    donor, newcomer = trainer(tmp_path), trainer(tmp_path)
    donor_state, new_state = _state(donor), _state(newcomer)
    ids = Ids(8)[0]["input_ids"][None]
    for _ in range(3):
        donor.model(input_ids=ids, labels=ids).loss.backward()
        donor.optimizer.step()
        donor.optimizer.zero_grad()
    for _ in range(37):
        donor.lr_scheduler.step()
    donor.state.global_step, donor.state.epoch = 37, 0.74

    new_state.adopt(donor_state.vector(), donor_state.extra())  # what a newcomer and a checkpoint take
    assert (newcomer.state.global_step, newcomer.state.epoch) == (37, 0.74)
    assert newcomer.lr_scheduler.last_epoch == 37
    assert newcomer.lr_scheduler.get_last_lr() == donor.lr_scheduler.get_last_lr()
    assert [g["lr"] for g in newcomer.optimizer.param_groups] == [g["lr"] for g in donor.optimizer.param_groups]
    for p, q in zip(newcomer.model.parameters(), donor.model.parameters()):
        assert torch.equal(p, q)
        assert all(torch.equal(newcomer.optimizer.state[p][k], donor.optimizer.state[q][k])
                   for k in ("exp_avg", "exp_avg_sq", "step"))
    model = newcomer.model
    assert model.lm_head.weight is model.transformer.wte.weight  # one tensor, in one slice of the vector


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_a_worker_given_a_gpu_trains_on_it(tmp_path, in_job):
    index, before = torch.cuda.device_count() - 1, torch.cuda.current_device()  # the last: not "cuda"'s default
    in_job(device=f"cuda:{index}")
    try:
        t = trainer(tmp_path, use_cpu=False)
        assert t.model.lm_head.weight.device == torch.device("cuda", index)
    finally:
        torch.cuda.set_device(before)
