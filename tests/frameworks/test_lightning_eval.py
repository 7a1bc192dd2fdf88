"""peerd's evaluation of a LightningModule (peerd.lightning._Validation):
Lightning's own validation, run from peerd's thread while the fit waits in a
hook, on a Trainer of its own. It returns what the fit's validation logs for
the same model, leaves the model where peerd's vector holds it, and the fit,
its callbacks and its counters never see it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from peerd.lightning import _Validation  # noqa: E402
from peerd.worker.state.flatparams import FlatParams  # noqa: E402
from lightning_module import EPOCHS, Tiny  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, needs_cuda])]


class Evaluates(pl.Callback):
    """Runs peerd's evaluation in another thread, as peerd's engine does, once
    mid-epoch and once the fit's training is over; checks what it leaves."""

    def __init__(self) -> None:
        self.results: list[dict[str, float]] = []
        self.fit_validations = 0

    def on_fit_start(self, trainer, pl_module):
        self.flat = FlatParams(pl_module)  # as peerd.attach makes the parameters views of its vector
        self.evaluate = _Validation(trainer, pl_module)

    def run(self, trainer, pl_module) -> None:
        before = [p.detach().clone() for p in pl_module.parameters()]
        training = [m.training for m in pl_module.modules()]
        with ThreadPoolExecutor(1) as pool:
            self.results.append(pool.submit(self.evaluate).result())
        start, size = self.flat.vector.data_ptr(), self.flat.vector.numel() * 4
        for p, b in zip(pl_module.parameters(), before):
            assert p.device == self.flat.vector.device and start <= p.data_ptr() < start + size
            assert torch.equal(p.detach(), b)
        assert [m.training for m in pl_module.modules()] == training
        assert pl_module.trainer is trainer and trainer.training

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 5:
            self.run(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.fit_validations += 1

    def on_train_end(self, trainer, pl_module):
        self.run(trainer, pl_module)
        self.logged = float(trainer.callback_metrics["val_acc"])


@pytest.mark.parametrize("device", DEVICES)
def test_peerds_evaluation_is_lightnings_validation_on_a_trainer_of_its_own(device):
    callback = Evaluates()
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator=device, devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])
    trainer.fit(Tiny())
    mid, end = callback.results
    assert set(mid) == set(end) == {"val_acc"}
    # At the end the model is the one the fit's last validation saw: the same number.
    assert end["val_acc"] == callback.logged
    # The fit validated once per epoch, its own; the evaluations changed none of its counters.
    assert callback.fit_validations == EPOCHS and trainer.current_epoch == EPOCHS
    assert trainer.global_step == EPOCHS * 1024 // 16
