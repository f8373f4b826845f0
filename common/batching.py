"""Records written by one background thread in batches, so many requests share one commit.

Writing each record from the request's own thread costs a thread hop and a commit per request; on
SQLite a commit is a disk sync, which under load is most of a short request's cost. Here requests
hand their finished record over and return; the writer waits up to ``linger_seconds`` for more and
stores them all in one go. A record is therefore in the database at most about ``linger_seconds``
(plus the write) after it was submitted. A process that exits writes what is pending first.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from django.db import close_old_connections

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BatchWriter(Generic[T]):
    def __init__(self, write: Callable[[list[T]], None], *, name: str, linger_seconds: float = 0.05) -> None:
        self._write_batch = write
        self.name = name
        self.linger_seconds = linger_seconds
        self._pending: list[T] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._writing = False
        self._thread: threading.Thread | None = None

    def submit(self, record: T) -> None:
        """Queue one record; returns at once."""
        with self._lock:
            self._pending.append(record)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far is stored; False if that took longer than ``timeout``."""
        with self._lock:
            return self._wake.wait_for(lambda: not self._pending and not self._writing, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: bool(self._pending))
                self._writing = True
            time.sleep(self.linger_seconds)
            with self._lock:
                batch, self._pending = self._pending, []
            try:
                self._write(batch)
            finally:
                with self._lock:
                    self._writing = False
                    self._wake.notify_all()

    def _write(self, batch: list[T]) -> None:
        try:
            self._write_batch(batch)
        except Exception:
            logger.exception("%s: writing %d records failed", self.name, len(batch))
        finally:
            # This thread is not a request: honour CONN_MAX_AGE (and drop broken connections) here.
            close_old_connections()

    def write_pending_at_exit(self) -> None:
        if not self.flush(timeout=5.0):
            logger.warning("%s: records still pending at exit", self.name)

    def flush_at_exit(self) -> BatchWriter[T]:
        atexit.register(self.write_pending_at_exit)
        return self
