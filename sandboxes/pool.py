"""The warm pool: sandboxes started ahead of demand, so that creating one is a claim, not a start.

Pool members are ordinary sandboxes (same image, limits and network; fresh random ``sbx_`` ids, used
as their hostname and, once claimed, as the database row's primary key). They belong to no
organization, hold no credentials and have no database row, so they count against no limit and are
invisible to the API. The runtime keeps them (``pooled`` in its state) and hands each out once
(``SandboxRuntime.claim``), whatever process asks.

The web process fills the pool: on its first health check or create, then again after every claim,
in one background thread. It drains the pool when it exits; whatever an abrupt stop leaves behind is
reused after a restart, and reconciliation destroys members that no longer answer.
"""

from __future__ import annotations

import atexit
import logging
import threading
from functools import cache

from django.conf import settings

from common.ids import new_id
from sandboxes.runtime import get_runtime
from sandboxes.runtimes.base import SandboxHandle, SandboxRuntime, SandboxState

logger = logging.getLogger(__name__)

# A refill right after a claim would compete for the CPU with the claimed sandbox's first commands
# (credentials, the caller's first exec); a short pause lets those go first.
REFILL_DELAY_SECONDS = 0.5
# A failing start (a host problem) is retried this much later, not in a tight loop.
RETRY_SECONDS = 10.0


def new_sandbox_id() -> str:
    return new_id("sbx")


class WarmPool:
    def __init__(self, runtime: SandboxRuntime, size: int) -> None:
        self.runtime = runtime
        self.size = size
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._delay = 0.0

    def claim(self) -> SandboxHandle | None:
        """A ready pool member, now the caller's alone; None when the pool is off or empty."""
        if self.size <= 0:
            return None
        handle = self.runtime.claim()
        self.replenish(delay=REFILL_DELAY_SECONDS)
        return handle

    def replenish(self, *, delay: float = 0.0) -> None:
        """Start (or wake) the filler thread of this process."""
        if self.size <= 0:
            return
        with self._lock:
            if self._stopping.is_set():
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-warm-pool", daemon=True)
                self._thread.start()
                atexit.register(self.shutdown)
            self._delay = delay
            self._wanted.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping.wait(self._delay):
                return
            try:
                self.runtime.fill_pool(self.size, new_sandbox_id, stop=self._stopping.is_set)
            except Exception:
                logger.exception("warm pool: starting a sandbox failed; retrying in %ss", RETRY_SECONDS)
                if self._stopping.wait(RETRY_SECONDS):
                    return
                self._wanted.set()

    def shutdown(self, timeout: float = 30.0) -> list[str]:
        """Stop filling and destroy the members: nothing of the pool outlives the process that made it."""
        with self._lock:
            self._stopping.set()
            self._wanted.set()
            thread = self._thread
        if thread is None:
            return []
        # A start in progress finishes first (at most the runtime's start timeout), so no half-made
        # sandbox is left behind.
        thread.join(timeout)
        try:
            return self.runtime.drain_pool()
        except Exception:
            logger.exception("warm pool: draining failed; reconciliation will clean up")
            return []

    def status(self) -> dict[str, int]:
        ready = sum(1 for info in self.runtime.list() if info.pooled and info.state == SandboxState.RUNNING)
        return {"size": self.size, "ready": ready}


@cache
def get_pool() -> WarmPool:
    return WarmPool(get_runtime(), settings.SANDBOX_WARM_POOL_SIZE)
