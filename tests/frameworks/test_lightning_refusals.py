"""The Peerd callback refuses, in the script's own process and before it
joins anything, a Trainer or an optimization that would train another job
than the job file's; outside a peerd job it says how to run one."""

from __future__ import annotations

import textwrap

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

import peerd.lightning  # noqa: E402
from peerd.control.launch import Launch, set_launch  # noqa: E402
from peerd.errors import ConfigError  # noqa: E402
from peerd.settings.jobspec import parse_job  # noqa: E402
from lightning_module import EPOCHS, Tiny  # noqa: E402


@pytest.fixture
def launched():
    """This process as a script job's worker whose daemon is nowhere: attach() would fail to reach it."""
    spec = parse_job(textwrap.dedent(f"""
        [job]
        name = "blobs"
        script = "train.py"
        epochs = {EPOCHS}
    """), "blobs.toml")
    set_launch(Launch(spec, "", "unix:/nonexistent/control.sock", "peer-0"))
    yield
    set_launch(None)


def trainer(**options) -> pl.Trainer:
    return pl.Trainer(**{"max_epochs": EPOCHS, "accelerator": "cpu", "devices": 1, "logger": False,
                         "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
                         "callbacks": [peerd.lightning.Peerd()], **options})


def test_outside_a_peerd_job_the_callback_says_how_to_run_one():
    with pytest.raises(ConfigError, match=r"not started by peerd; run it as a script job"):
        trainer().fit(Tiny())


@pytest.mark.parametrize("options, says", [
    (dict(max_epochs=EPOCHS + 2), f"Trainer(max_epochs={EPOCHS + 2}) must be the job's [job] epochs = {EPOCHS}"),
    (dict(max_epochs=None), "an unset max_epochs is 1000"),
    (dict(max_steps=50), "drop Trainer(max_steps=50)"),
    (dict(val_check_interval=0.5), "leave Trainer(val_check_interval) at 1.0"),
    (dict(limit_train_batches=0.25), "drop limit_train_batches"),
    (dict(callbacks=[peerd.lightning.Peerd(), pl.callbacks.EarlyStopping("val_acc")]), "drop EarlyStopping"),
])
def test_a_trainer_of_another_job_is_refused_before_joining(launched, options, says):
    with pytest.raises(ConfigError, match="this Trainer cannot train the job") as caught:
        trainer(**options).fit(Tiny())
    assert says in str(caught.value)


def test_an_optimization_peerd_cannot_follow_is_refused_before_joining(launched):
    class Manual(Tiny):  # a GAN's way: two optimizers stepped in training_step
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]

    with pytest.raises(ConfigError, match="use automatic optimization") as caught:
        trainer().fit(Manual())
    assert "configure_optimizers gave 2" in str(caught.value)
