"""Threads kept between jobs (no import beyond the standard library: the daemon runs it inside the
sandbox, and the control plane uses it too).

Starting a thread costs its starter a clone and a wait until the new thread runs; on a busy
two-CPU host that wait is most of a millisecond, which a short exec's round trip (in the daemon)
or a create's answer (in the control plane) would otherwise pay. Idle workers wait for the next
job instead; a job that finds none idle gets a new one (jobs may block as long as they last, so the
number is not capped), and a worker idle for IDLE_SECONDS ends, so a burst leaves no crowd of
threads behind.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

# typing costs start-up time inside every sandbox and only the type checker needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Workers:
    IDLE_SECONDS = 30.0

    def __init__(self, handle: Callable[[Any], None], *, name: str = "worker") -> None:
        self._handle = handle
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def dispatch(self, item: Any) -> None:
        """Hand ``item`` to an idle worker, or to a new one if none is idle."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put(item)
                return
        threading.Thread(target=self._run, args=(item,), name=self._name, daemon=True).start()

    def start_resident(self) -> None:
        """A worker that waits for jobs from now on and never retires: the first job, and any later
        one, then finds a thread waiting."""
        with self._lock:
            self._idle += 1
        threading.Thread(
            target=self._run, args=(None,), kwargs={"resident": True}, name=self._name, daemon=True
        ).start()

    def _run(self, item: Any, *, resident: bool = False) -> None:
        while True:
            if item is not None:
                self._handle(item)
                with self._lock:
                    self._idle += 1
            if resident:
                item = self._queue.get()
                continue
            try:
                item = self._queue.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    # A job may have been promised to this worker just as it timed out.
                    if self._queue.empty():
                        self._idle -= 1
                        return
                item = self._queue.get()
