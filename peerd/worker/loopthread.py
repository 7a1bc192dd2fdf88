"""An event loop of the engine's own, in a daemon thread: the Peer facade
(peerd.peer) runs the engine there, so its server keeps answering partners
while the training thread computes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine


class LoopThread:
    def __init__(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:  # no uvloop on this platform
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="peerd-engine", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine, timeout: float | None = None):
        """Run `coro` in the loop and wait for it; an interrupt cancels it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self, timeout: float) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
