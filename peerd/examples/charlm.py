"""The built-in language-model example: a small character-level causal
transformer trained on Python standard library source shipped with peerd.

The text (data/pystdlib.txt.xz, ~1.2 M characters of CPython 3.11's own
modules; data/README.md gives its source, licence and how it was built) needs
no download. The first 94 % is for training, the rest for validation: the end
of traceback.py, then types.py, warnings.py and weakref.py, modules the model
never reads. A sample is a window of CONTEXT + 1 characters starting at a
multiple of CONTEXT: the input is its first CONTEXT characters, the target the
same shifted by one.

A job module in peerd's protocol: make_model, make_datasets, loss, evaluate.
"""

from __future__ import annotations

import lzma
import math
from collections.abc import Iterable
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

VOCAB = "\n" + "".join(chr(c) for c in range(0x20, 0x7F))  # newline + printable ASCII
CONTEXT = 128  # characters a sample's input holds
D_MODEL = 128
LAYERS = 3
HEADS = 4
TRAIN_FRACTION = 0.94

_CODE = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> torch.Tensor:
    """Characters to token ids (uint8); a character outside VOCAB is a KeyError."""
    return torch.tensor([_CODE[c] for c in text], dtype=torch.uint8)


def decode(ids: Iterable[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def load_text() -> str:
    path = resources.files("peerd.examples").joinpath("data/pystdlib.txt.xz")
    with path.open("rb") as f:
        return lzma.decompress(f.read()).decode("ascii")


class CharWindows(Dataset):
    """Windows of `context` + 1 tokens, one every `context` tokens (neighbours
    share one token), as (input, target) pairs: target = input shifted by one."""

    def __init__(self, tokens: torch.Tensor, context: int = CONTEXT) -> None:
        if len(tokens) <= context:
            raise ValueError(f"need more than {context} tokens, got {len(tokens)}")
        self.tokens, self.context = tokens, context

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.context
        window = self.tokens[start : start + self.context + 1].long()
        return window[:-1], window[1:]


def make_datasets() -> tuple[CharWindows, CharWindows]:
    tokens = encode(load_text())
    cut = int(len(tokens) * TRAIN_FRACTION)
    return CharWindows(tokens[:cut]), CharWindows(tokens[cut:])


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharLM(nn.Module):
    """Token + learned position embeddings, pre-norm blocks, a final LayerNorm,
    and an output layer (untied: every parameter its own tensor, so nothing
    that walks a state_dict sees one twice). Returns logits (B, T, V)."""

    def __init__(self, vocab: int, context: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(context, d_model))
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self._init(layers)

    def _init(self, layers: int) -> None:
        """GPT-2's: N(0, 0.02) weights, zero biases, residual outputs scaled by
        1/sqrt(2·layers). Drawn from torch's global generator (peerd seeds it)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.position, std=0.02)
        for block in self.blocks:
            for residual in (block.proj, block.out):
                nn.init.normal_(residual.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def make_model() -> CharLM:
    return CharLM(len(VOCAB), CONTEXT, D_MODEL, LAYERS, HEADS)


def _token_losses(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy per character, in nats."""
    return _token_losses(model, batch).mean()


def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Validation loss (nats per character, over every target token) and its perplexity."""
    total, count = 0.0, 0
    for batch in batches:
        losses = _token_losses(model, batch)
        total += float(losses.sum())
        count += losses.numel()
    if count == 0:
        raise ValueError("evaluate() got no batches")
    val_loss = total / count
    return {"val_loss": val_loss, "perplexity": math.exp(val_loss)}
