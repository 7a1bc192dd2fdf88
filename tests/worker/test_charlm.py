"""The language-model example job (peerd/examples/charlm.py), on its own: the
module protocol's callables, the shipped text, and that a short run learns."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from peerd.examples import charlm

V = len(charlm.VOCAB)


@pytest.fixture(scope="module")
def datasets() -> tuple[charlm.CharWindows, charlm.CharWindows]:
    return charlm.make_datasets()


def seeded_model(seed: int = 0) -> charlm.CharLM:
    torch.manual_seed(seed)
    return charlm.make_model()


def test_vocabulary_is_newline_and_printable_ascii() -> None:
    assert V == 96 and len(set(charlm.VOCAB)) == V
    assert charlm.decode(charlm.encode("def f(x):\n    return x ~ 1\n").tolist()) == "def f(x):\n    return x ~ 1\n"
    with pytest.raises(KeyError):
        charlm.encode("\t")


def test_the_shipped_text_is_python_source_in_the_vocabulary() -> None:
    text = charlm.load_text()
    assert len(text) > 1_000_000
    assert text.startswith("# file: abc.py\n")
    assert set(text) <= set(charlm.VOCAB)


def test_datasets_hold_out_the_end_of_the_text(datasets) -> None:
    train, test = datasets
    n = len(charlm.load_text())
    cut = int(n * charlm.TRAIN_FRACTION)
    assert len(train) == (cut - 1) // charlm.CONTEXT
    assert len(test) == (n - cut - 1) // charlm.CONTEXT
    assert 0.04 < len(test) / (len(train) + len(test)) < 0.10
    assert torch.equal(test.tokens, charlm.encode(charlm.load_text()[cut:]))


def test_a_sample_is_a_window_and_its_shift_by_one(datasets) -> None:
    train, _ = datasets
    for index in (0, 1, len(train) - 1):
        x, y = train[index]
        assert x.shape == y.shape == (charlm.CONTEXT,)
        assert x.dtype == y.dtype == torch.long
        assert torch.equal(x[1:], y[:-1])
        assert 0 <= int(x.min()) and int(x.max()) < V
    (_, y0), (x1, _) = train[0], train[1]
    assert y0[-1] == x1[0]  # windows tile the text
    with pytest.raises(IndexError):
        train[len(train)]


def test_model_is_deterministic_given_the_seed_and_has_no_batchnorm() -> None:
    a, b, c = seeded_model(0), seeded_model(0), seeded_model(1)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embed.weight, c.embed.weight)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in a.modules())
    assert any(isinstance(m, torch.nn.LayerNorm) for m in a.modules())
    assert all(p.dtype == torch.float32 for p in a.parameters())


def test_model_output_is_logits_per_position() -> None:
    model = seeded_model()
    tokens = torch.randint(0, V, (3, charlm.CONTEXT))
    assert model(tokens).shape == (3, charlm.CONTEXT, V)
    assert model(tokens[:, :10]).shape == (3, 10, V)


def test_model_is_causal() -> None:
    model = seeded_model().eval()
    tokens = torch.randint(0, V, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % V
    with torch.no_grad():
        assert torch.allclose(model(tokens)[0, :10], model(changed)[0, :10], atol=1e-6)


def test_loss_is_a_finite_scalar_with_grad_near_uniform_at_init(datasets) -> None:
    train, _ = datasets
    model = seeded_model()
    batch = next(iter(DataLoader(train, batch_size=4)))
    value = charlm.loss(model, batch)
    assert value.shape == () and value.requires_grad and math.isfinite(value.item())
    assert abs(value.item() - math.log(V)) < 0.1
    value.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_loss_under_bf16_autocast_is_fp32() -> None:
    model = seeded_model()
    batch = (torch.randint(0, V, (2, 32)), torch.randint(0, V, (2, 32)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = charlm.loss(model, batch)
    assert value.dtype == torch.float32 and math.isfinite(value.item())


def test_evaluate_reports_val_loss_and_perplexity(datasets) -> None:
    _, test = datasets
    model = seeded_model().eval()
    with torch.no_grad():
        metrics = charlm.evaluate(model, DataLoader(Subset(test, range(10)), batch_size=4))
    assert set(metrics) == {"val_loss", "perplexity"}
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["val_loss"]))
    with pytest.raises(ValueError, match="no batches"):
        charlm.evaluate(model, [])


def test_a_short_run_learns_well_below_the_uniform_guess(datasets) -> None:
    """40 AdamW steps of 16 windows (bf16 autocast, clipping) take the validation
    loss from ln(96) = 4.56 to 2.52 (measured): below 3.03, the cross-entropy of
    the training text's character frequencies on the validation text, so the
    model uses context. Fixed references, not a time."""
    train, test = datasets
    model = seeded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    for step in range(40):
        batch = torch.utils.data.default_collate([train[int(i)] for i in order[step * 16 : (step + 1) * 16]])
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 10)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value = charlm.loss(model, batch)
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        metrics = charlm.evaluate(model, DataLoader(Subset(test, range(64)), batch_size=32))
    assert metrics["val_loss"] < 2.8
