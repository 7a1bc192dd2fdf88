"""The model file a job ends with (model.pt and model.json beside it), and peerctl
export's: a plain state_dict, loadable without peerd, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict, copied to the CPU (the file loads on any machine)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def save_model(model: nn.Module, path: Path, **info: object) -> None:
    """Write the model as a plain state_dict (`model.load_state_dict(torch.load(path))`
    works without peerd), atomically, with `info` beside it as JSON (model.json)."""
    write_model(model_state(model), path, **info)


def load_model(model: nn.Module, path: Path) -> None:
    """A model file into `model`, in place (its parameters may be views of the
    training state's flat buffer)."""
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def write_model(state: dict[str, torch.Tensor], path: Path, **info: object) -> None:
    """save_model for a state_dict already taken (`model_state`)."""
    _write_atomic(path, lambda f: torch.save(state, f))
    text = json.dumps(info, indent=1, sort_keys=True, default=float) + "\n"
    _write_atomic(path.with_suffix(".json"), lambda f: f.write(text.encode()))


def _write_atomic(path: Path, write) -> None:
    """A crash mid-write leaves the old file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
