"""What the training baselines share: the data-parallel step's all-reduce of
the gradients, and a model's accuracy on test tensors."""

from __future__ import annotations


def allreduce_grads(params: list, flag: float, world: int) -> float:
    """Average the gradients over the gloo group as DDP does (one flat all-reduce,
    which waits for the slowest rank), with `flag` riding along: the mean flag
    returned is > 0 when any rank raised it (a stop)."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([flag])])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return float(flat[-1])


def accuracy(model, x, y, batch: int = 500, eval_mode: bool = True) -> float:
    """The share of `x` the model classifies as `y`, in batches, without gradients."""
    import torch

    if eval_mode:
        model.eval()
    with torch.no_grad():
        correct = sum(int((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum()) for i in range(0, len(y), batch))
    return correct / len(y)
