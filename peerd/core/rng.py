"""A portable seeded random stream.

Every peer must draw the same topology and data permutation from the same seed,
whatever its Python version or platform, so this does not use `random` (whose
algorithms are not promised stable across releases) but counter-mode BLAKE2b.
"""

from __future__ import annotations

import hashlib
import json


def derive_seed(*parts: object) -> bytes:
    """A 32-byte seed from parts such as (job, round, segment)."""
    # JSON keeps parts apart whatever they contain: ("a,b",) != ("a", "b").
    text = json.dumps(parts, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


class SeededStream:
    """Uniform integers drawn from BLAKE2b(seed, counter)."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) > 64:
            raise ValueError(f"seed must be at most 64 bytes (a BLAKE2b key), got {len(seed)}")
        self._seed = seed
        self._counter = 0

    def _next_u64(self) -> int:
        block = hashlib.blake2b(
            self._counter.to_bytes(8, "little"), key=self._seed, digest_size=8
        ).digest()
        self._counter += 1
        return int.from_bytes(block, "little")

    def below(self, n: int) -> int:
        """Uniform in [0, n), by rejection so there is no modulo bias."""
        if not 0 < n <= 1 << 64:
            raise ValueError(f"n must be in 1..2**64, got {n}")
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self._next_u64()
            if x < limit:
                return x % n

    def shuffle(self, items: list) -> None:
        """Fisher-Yates, in place."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
