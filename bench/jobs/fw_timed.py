"""A framework example, unchanged, with a clock on its optimizer: for
bench/frameworks.py, alone and as a script job.

    python bench/jobs/fw_timed.py lightning [EXAMPLE ARGS]   # examples/lightning_digits.py
    python bench/jobs/fw_timed.py hf [EXAMPLE ARGS]          # examples/hf_charlm.py

The Trainer (Lightning's, or Hugging Face's and so peerd.transformers') gets
one more callback that, once training starts, hooks the optimizer: the
perf_counter after every optimizer step, written to step_times.json in the
working directory when training ends. Each step's time, from one such
stamp to the next, holds all of it: loading, forward, backward, the
optimizer, and under peerd its part after the step (peer.step(), the round).
"""

import json
import runpy
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = {"lightning": "lightning_digits.py", "hf": "hf_charlm.py"}


class Stamps:
    def __init__(self) -> None:
        self.times: list[float] = []

    def hook(self, optimizer) -> None:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds torch's
        optimizer.register_step_post_hook(lambda *args: self.times.append(time.perf_counter()))

    def write(self) -> None:
        Path("step_times.json").write_text(json.dumps(self.times))


def clock_lightning(stamps: Stamps) -> None:
    import lightning.pytorch as pl

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            stamps.hook(trainer.optimizers[0])

        def on_train_end(self, trainer, pl_module) -> None:
            stamps.write()

    made = pl.Trainer.__init__

    def init(self, *args, **kwargs) -> None:
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), Clock()]
        made(self, *args, **kwargs)

    pl.Trainer.__init__ = init


def clock_hf(stamps: Stamps) -> None:
    import transformers

    class Clock(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
            stamps.hook(optimizer)

        def on_train_end(self, args, state, control, **kwargs) -> None:
            stamps.write()

    made = transformers.Trainer.__init__

    def init(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        self.add_callback(Clock())

    transformers.Trainer.__init__ = init


def main() -> None:
    framework, rest = sys.argv[1], sys.argv[2:]
    stamps = Stamps()
    (clock_lightning if framework == "lightning" else clock_hf)(stamps)
    script = EXAMPLES / SCRIPTS[framework]
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
