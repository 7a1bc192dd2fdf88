"""A plain Hugging Face Trainer script: a small GPT-2 (made from a GPT2Config,
random init) learns to predict the next character of Python's own source, the
text that ships with peerd (peerd/examples/data). Nothing is downloaded: no
pretrained weights, no tokenizer; the vocabulary is the text's characters.

Alone, in one process:       python examples/hf_charlm.py
  at the batch of 3 peers:   python examples/hf_charlm.py --batch 48
Under peerd (3 local peers): peerd cluster --job examples/hf_charlm.toml

The job file passes --peerd: the Trainer is then peerd.transformers.Trainer,
the one changed line (docs/operations.md, "Hugging Face Trainer"). --epochs must
be the job's [job] epochs: the Trainer lays its LR schedule over its own.
"""

import argparse
import os

# A fresh machine may have no network: never ask the Hub for anything.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from peerd.examples.charlm import load_text  # noqa: E402

EPOCHS, CONTEXT, TRAIN, VAL = 2, 64, 2048, 256  # characters per sample; samples to train on and to evaluate on


class Windows(Dataset):
    """Consecutive windows of CONTEXT characters; the labels are the inputs
    (GPT2LMHeadModel shifts them by one itself)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids) // CONTEXT

    def __getitem__(self, index: int) -> dict:
        window = self.ids[index * CONTEXT : (index + 1) * CONTEXT]
        return {"input_ids": window, "labels": window}


def datasets() -> tuple[list[str], Windows, Windows]:
    """The vocabulary (every character of the text) and the first TRAIN + VAL windows, split."""
    text = load_text()
    vocab = sorted(set(text))
    code = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([code[c] for c in text[: (TRAIN + VAL) * CONTEXT]], dtype=torch.long)
    return vocab, Windows(ids[: TRAIN * CONTEXT]), Windows(ids[TRAIN * CONTEXT :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=float, default=EPOCHS)
    parser.add_argument("--batch", type=int, default=16,
                        help="samples per optimizer step (per_device_train_batch_size); alone, 48 trains the global "
                             "batch of three peers at 16, as DDP over three processes would")
    parser.add_argument("--seed", type=int, default=0, help="the model's initialisation and the Trainer's seed")
    parser.add_argument("--peerd", action="store_true", help="train as a worker of a peerd job (its job file says so)")
    args = parser.parse_args()
    if args.peerd:
        from peerd.transformers import Trainer
    else:
        from transformers import Trainer

    vocab, train_set, val_set = datasets()
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=CONTEXT, n_embd=128, n_layer=2,
                                       n_head=4, bos_token_id=0, eos_token_id=0))
    # The warm-up is the first 320 samples whatever the batch (20 steps of 16, as under peerd, where the
    # Trainer's schedule follows the job's position in steps of one process).
    training = TrainingArguments(
        output_dir="hf_charlm_out",  # the Trainer's own files (none with save_strategy="no")
        num_train_epochs=args.epochs, per_device_train_batch_size=args.batch, learning_rate=2e-3,
        warmup_steps=round(320 / args.batch), lr_scheduler_type="cosine", weight_decay=0.1, eval_strategy="epoch", per_device_eval_batch_size=64,
        logging_steps=25, save_strategy="no", report_to="none", disable_tqdm=True, seed=args.seed,
        dataloader_pin_memory=torch.cuda.is_available())  # pinned memory is for copies to a GPU
    trainer = Trainer(model=model, args=training, train_dataset=train_set, eval_dataset=val_set)
    trainer.train()  # under peerd: returns with the job's final model in `model`
    print(f"validation loss {trainer.evaluate()['eval_loss']:.4f} nats per character "
          f"(a uniform guess over the {len(vocab)} characters: {torch.tensor(len(vocab)).log():.4f})")


if __name__ == "__main__":
    main()
