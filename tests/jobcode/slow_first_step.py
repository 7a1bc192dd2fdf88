"""A script whose first step comes when the test says so (as a compile or a large
data load would make it late): peerd's no-step warning shows meanwhile, and a
SIGTERM that lands before the first step still leaves after that step with a
checkpoint of it."""

from pathlib import Path
import time

import torch
from torch import nn

import peerd

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
peer = peerd.attach(model, optimizer)
go = Path("go")  # in the worker's directory, where the script runs
while not go.exists():
    time.sleep(0.05)
data = torch.utils.data.TensorDataset(torch.randn(512, 6), torch.randint(0, 3, (512,)))
for x, y in peer.loader(data, batch_size=16):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    peer.step(loss=loss)
    if peer.should_stop:
        break
