"""A user's training script for the script-job tests: its own loop, a
BatchNorm model, AdamW, a scheduler and one more registered object."""

import sys

import torch
from torch import nn

import peerd
from real_job import make_datasets, make_model


class Counter:
    """Something of the script's own that a newcomer must receive."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def main() -> None:
    torch.manual_seed(0)
    model = make_model()
    train_set, test_set = make_datasets()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10_000)
    counter = Counter()
    peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval="step", state={"counter": counter})
    print(f"attached: step {peer.source.step_count} counter {counter.steps} "
          f"last_epoch {scheduler.last_epoch} lr {optimizer.param_groups[0]['lr']:.6g}", flush=True)
    for x, y in peer.loader(train_set):
        model.train()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        counter.steps += 1
        peer.step(batch_size=len(x), loss=loss.item())
        if peer.should_stop:
            break
    model.eval()
    with torch.no_grad():
        x, y = test_set.tensors
        peer.report({"accuracy": float((model(x).argmax(1) == y).float().mean())})


if __name__ == "__main__":
    if sys.argv[1:] != ["--flag", "value"]:
        raise SystemExit(f"unexpected arguments {sys.argv[1:]}")
    main()
