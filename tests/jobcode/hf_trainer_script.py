"""A plain Hugging Face Trainer script under peerd: the Trainer's import is the
one line that differs from its single-process twin. A tiny GPT-2 (its LM head
tied to its token embedding, random init from a config: no download) learns
characters of the text shipped in peerd/examples/data, with
gradient_accumulation_steps=2 and bf16 autocast. The first argument is
num_train_epochs; `plain N` trains alone instead, in one process, with the
batch of N peers (what DDP over N processes would train: the same global
batch, one optimizer step on it) and the Trainer of transformers.

A file `hold` in its working directory holds it before train(), its imports
done and its Trainer made, until the file is gone; it writes `holding`
meanwhile.

It writes, to summary.json in its working directory, what the Trainer did:
its optimizer steps and micro-batches, the samples it trained on, the dtype of
an activation during training, its global_step after each step and at its own
evaluations (every 25 steps), peerd's evaluations while it trained, and its
state and LR schedule at the end."""

import json
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from peerd.examples.charlm import VOCAB, encode, load_text

EPOCHS = 2  # num_train_epochs alone (`plain N`): the test job's epochs
CONTEXT, TRAIN, TEST = 64, 1024, 128  # characters a sample holds, windows to train on and to evaluate on


class Windows(Dataset):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens) // CONTEXT

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index * CONTEXT : (index + 1) * CONTEXT].long()
        return {"input_ids": ids, "labels": ids}


class Counts(TrainerCallback):
    """This peer's optimizer steps and micro-batches, the global_step after each
    step, and where the Trainer's own evaluations came."""

    def __init__(self) -> None:
        self.steps = self.micro = 0
        self.positions, self.evaluated_at, self.training = [], [], False
        self.peerd_evaluations = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.training = True

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False  # peerd's evaluations at the end come after

    def on_substep_end(self, args, state, control, **kwargs):
        self.micro += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        self.micro += 1
        self.positions.append(state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        if not self.training:
            return
        if threading.current_thread() is threading.main_thread():  # the Trainer's own (eval_strategy)
            self.evaluated_at.append(state.global_step)
        else:  # peerd's, every eval_every_rounds rounds, from its engine's thread
            self.peerd_evaluations += 1


def main(epochs: float, peers: int) -> None:
    if peers:
        from transformers import Trainer
    else:
        from peerd.transformers import Trainer  # instead of: from transformers import Trainer
    tokens = encode(load_text()[: (TRAIN + TEST) * CONTEXT])
    train_set, test_set = Windows(tokens[: TRAIN * CONTEXT]), Windows(tokens[TRAIN * CONTEXT :])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=len(VOCAB), n_positions=CONTEXT,
                                       bos_token_id=0, eos_token_id=0))
    seen = {"samples": 0, "dtypes": set()}

    def count(module, args, kwargs):
        if module.training:
            seen["samples"] += kwargs["input_ids"].shape[0]

    model.register_forward_pre_hook(count, with_kwargs=True)
    model.transformer.h[0].mlp.c_fc.register_forward_hook(
        lambda m, i, out: seen["dtypes"].add(str(out.dtype)) if m.training else None)
    args = TrainingArguments(output_dir="trainer_output", num_train_epochs=epochs, per_device_train_batch_size=16 * max(peers, 1),
                             gradient_accumulation_steps=2, learning_rate=3e-3, bf16=True, use_cpu=True,
                             report_to="none", save_strategy="no", eval_strategy="steps", eval_steps=25,
                             logging_steps=10,
                             disable_tqdm=True, seed=0)
    counts = Counts()
    trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=test_set, callbacks=[counts])
    hold = Path("hold")
    if hold.exists():
        Path("holding").touch()
        while hold.exists():
            time.sleep(0.05)
    output = trainer.train()
    with open("summary.json", "w") as f:
        json.dump({"steps": counts.steps, "micro": counts.micro, "samples": seen["samples"],
                   "dtypes": sorted(seen["dtypes"]), "global_step": trainer.state.global_step,
                   "max_steps": trainer.state.max_steps, "epoch": trainer.state.epoch,
                   "scheduler_steps": trainer.lr_scheduler.last_epoch, "last_lr": trainer.lr_scheduler.get_last_lr(),
                   "training_loss": output.training_loss, "positions": counts.positions,
                   "evaluated_at": counts.evaluated_at, "peerd_evaluations": counts.peerd_evaluations,
                   "logged_losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
                   "eval_loss": trainer.evaluate()["eval_loss"]}, f)


if __name__ == "__main__":
    if sys.argv[1] == "plain":
        main(EPOCHS, int(sys.argv[2]))
    else:
        main(float(sys.argv[1]), 0)
