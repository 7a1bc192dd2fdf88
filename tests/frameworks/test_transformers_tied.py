"""A GPT-2's LM head tied to its token embedding in peerd's training state
(peerd.worker.state.flatparams): one Parameter, so one slice of the gossiped
vector; an average, a move to another buffer, the end's consensus and the model
files keep it one tensor. Tied as two Parameters over the same memory, a model
is refused rather than untied."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from peerd.worker.state.finalmodel import FinalModel
from peerd.worker.state.modelfile import model_state
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.optim import init_state


def gpt2(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16,
                                      bos_token_id=0, eos_token_id=0))


def state_of(model: nn.Module) -> TrainState:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    init_state(optimizer)
    return TrainState(model, optimizer)


def tied(model: GPT2LMHeadModel) -> bool:
    return model.lm_head.weight is model.transformer.wte.weight


def test_a_tied_head_is_one_slice_of_the_vector_through_averages_and_the_end(tmp_path):
    a, b = gpt2(0), gpt2(1)
    sa, sb = state_of(a), state_of(b)
    assert tied(a) and "lm_head.weight" in a.state_dict()  # the state_dict lists it twice, the vector once
    assert sa.flat.numel == sum(v.numel() for k, v in a.state_dict().items() if k != "lm_head.weight")
    assert len(sa.kept) == 2 * len(sa.params)  # one pair of Adam moments for it, as for every parameter
    assert a.lm_head.weight.untyped_storage().data_ptr() == sa.flat.vector.untyped_storage().data_ptr()

    mean = (a.transformer.wte.weight.detach() + b.transformer.wte.weight.detach()) / 2
    sa.flat.vector.lerp_(sb.flat.vector, 0.5)  # a round's average, in place
    assert tied(a) and torch.allclose(a.lm_head.weight, mean)
    sa.flat.rebind(sa.flat.vector.clone())  # a round that wrote a new buffer
    assert tied(a) and a.lm_head.weight.untyped_storage().data_ptr() == sa.flat.vector.untyped_storage().data_ptr()

    sb.adopt(sa.vector(), sa.extra())  # a newcomer's state transfer
    assert tied(b) and torch.equal(b.lm_head.weight, a.lm_head.weight)
    sb.flat.vector.mul_(0.5)
    FinalModel(sb).adopt(FinalModel(sa).vector())  # the end's consensus
    assert tied(b) and torch.equal(b.lm_head.weight, a.lm_head.weight)

    saved = model_state(b)  # model.pt
    assert torch.equal(saved["lm_head.weight"], saved["transformer.wte.weight"])
    hf_logging.disable_progress_bar()  # a bar's monitor thread would outlive the test
    try:
        b.save_pretrained(tmp_path)
        loaded = GPT2LMHeadModel.from_pretrained(tmp_path)
    finally:
        hf_logging.enable_progress_bar()
    assert tied(loaded) and torch.equal(loaded.lm_head.weight, saved["lm_head.weight"])


def test_a_head_tied_as_a_second_parameter_over_the_same_storage_is_refused():
    model = gpt2(0)
    model.lm_head.weight = nn.Parameter(model.transformer.wte.weight.data)  # two objects, one storage
    with pytest.raises(ValueError, match=r"transformer.wte.weight and lm_head.weight are two nn.Parameter objects "
                                         r"over the same memory; tie them as one"):
        state_of(model)


def test_a_model_whose_parameters_are_already_views_into_one_buffer_is_taken():
    model = gpt2(0)
    first = state_of(model)
    second = state_of(model)  # its parameters now lie side by side in the first's vector
    assert tied(model) and second.flat.numel == first.flat.numel
