"""The real task every simulated peer trains on: the embedded 5,000 MNIST digits.

Parameters of all peers live in one (peers × params) float32 array, and
gradients of all peers are computed together with batched matrix products, so a
thousand peers cost about as much as one model on a thousand times the data.
Two models: softmax regression ("logreg", 7,850 parameters) and a one-hidden-layer
ReLU network ("mlp"). The split into 4,000 training and 1,000 test digits is the
example job's (peerd/examples/mnist.py: same seed, same normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

TEST_SIZE = 1000
CLASSES = 10
MODELS = ("logreg", "mlp")


def load_mnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, test x, test y); x is (n, 784) float32, normalised."""
    with resources.files("peerd.examples").joinpath("data/mnist_5k.npz").open("rb") as f:
        archive = np.load(f)
        images, labels = archive["images"], archive["labels"]
    order = np.random.default_rng(12345).permutation(len(labels))
    x = ((images[order].reshape(len(labels), -1).astype(np.float32) / 255.0) - 0.1307) / 0.3081
    y = labels[order].astype(np.int64)
    return x[TEST_SIZE:], y[TEST_SIZE:], x[:TEST_SIZE], y[:TEST_SIZE]


@dataclass(frozen=True)
class Layout:
    """Where each tensor sits in the flat parameter vector."""

    inputs: int
    hidden: int  # 0: softmax regression

    def shapes(self) -> list[tuple[int, ...]]:
        if self.hidden == 0:
            return [(self.inputs, CLASSES), (CLASSES,)]
        return [(self.inputs, self.hidden), (self.hidden,), (self.hidden, CLASSES), (CLASSES,)]

    @property
    def size(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes())

    def unpack(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views of (peers × size) as (peers, *shape) tensors."""
        out, at = [], 0
        for shape in self.shapes():
            n = int(np.prod(shape))
            out.append(flat[:, at : at + n].reshape(flat.shape[0], *shape))
            at += n
        return out


class Task:
    def __init__(self, model: str = "logreg", hidden: int = 32, weight_decay: float = 1e-4) -> None:
        if model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        if model == "mlp" and hidden < 1:
            raise ValueError(f"an mlp needs hidden ≥ 1, got {hidden}")
        self.train_x, self.train_y, self.test_x, self.test_y = load_mnist()
        self.layout = Layout(self.train_x.shape[1], hidden if model == "mlp" else 0)
        self.weight_decay = weight_decay

    @property
    def size(self) -> int:
        return self.layout.size

    def init(self, seed: int) -> np.ndarray:
        """One flat initial model (every peer starts from it)."""
        rng = np.random.default_rng([seed, 3])
        parts = []
        for shape in self.layout.shapes():
            if len(shape) == 2:
                parts.append(rng.uniform(-1, 1, shape) / np.sqrt(shape[0]))
            else:
                parts.append(np.zeros(shape))
        return np.concatenate([p.ravel() for p in parts]).astype(np.float32)

    def _forward(self, params: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        tensors = self.layout.unpack(params)
        if self.layout.hidden == 0:
            w, b = tensors
            return np.matmul(x, w) + b[:, None, :], None
        w1, b1, w2, b2 = tensors
        pre = np.matmul(x, w1) + b1[:, None, :]
        return np.matmul(np.maximum(pre, 0), w2) + b2[:, None, :], pre

    def grads(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean cross-entropy gradient of every peer on its own batch.

        params (P, D); x (P, b, inputs); y (P, b); mask (P, b) with 1 for a real
        sample and 0 for padding (peers may hold different batch sizes).
        Returns (grad (P, D), loss (P,)).
        """
        logits, pre = self._forward(params, x)
        logits = logits - logits.max(axis=2, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=2, keepdims=True)
        count = np.maximum(mask.sum(axis=1), 1.0)
        picked = np.take_along_axis(p, y[:, :, None], axis=2)[:, :, 0]
        loss = -(np.log(np.maximum(picked, 1e-12)) * mask).sum(axis=1) / count
        d = p
        np.put_along_axis(d, y[:, :, None], picked[:, :, None] - 1.0, axis=2)
        d *= (mask / count[:, None])[:, :, None]
        grad = np.empty_like(params)
        g = self.layout.unpack(grad)
        if pre is None:
            g[0][:] = np.matmul(x.transpose(0, 2, 1), d)
            g[1][:] = d.sum(axis=1)
        else:
            w2 = self.layout.unpack(params)[2]
            h = np.maximum(pre, 0)
            g[2][:] = np.matmul(h.transpose(0, 2, 1), d)
            g[3][:] = d.sum(axis=1)
            dh = np.matmul(d, w2.transpose(0, 2, 1)) * (pre > 0)
            g[0][:] = np.matmul(x.transpose(0, 2, 1), dh)
            g[1][:] = dh.sum(axis=1)
        if self.weight_decay:
            grad += self.weight_decay * params
        return grad, loss

    def accuracy(self, params: np.ndarray, chunk: int = 64) -> np.ndarray:
        """Test accuracy of each row of params (P, D)."""
        out = []
        for at in range(0, params.shape[0], chunk):
            block = params[at : at + chunk]
            x = np.broadcast_to(self.test_x, (block.shape[0], *self.test_x.shape))
            logits, _ = self._forward(block, x)
            out.append((logits.argmax(axis=2) == self.test_y[None, :]).mean(axis=1))
        return np.concatenate(out)
