"""The audit of the tool HTTP API's fast path, written by one background thread in batches.

A plain JSON call is recorded after its response was sent. Writing each record from the request's
own thread costs a thread hop and a commit per call; on SQLite a commit is a disk sync, which under
load is most of a call's cost. Here requests hand their finished record over and return; the writer
waits up to LINGER_SECONDS for more and stores them all in one statement, so many calls share one
commit. A record is therefore in the database at most about LINGER_SECONDS (plus the write) after
its response. Records are complete when handed over (status, sizes, duration); a process that exits
writes what is pending first.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

from django.db import close_old_connections

from toolapi import services

logger = logging.getLogger(__name__)

LINGER_SECONDS = 0.05


class CallRecorder:
    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._writing = False
        self._thread: threading.Thread | None = None

    def submit(self, call: dict[str, Any]) -> None:
        """Queue one call's record (the keyword arguments of services.record_call); returns at once."""
        with self._lock:
            self._pending.append(call)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="toolapi-call-recorder", daemon=True)
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
            time.sleep(LINGER_SECONDS)
            with self._lock:
                batch, self._pending = self._pending, []
            try:
                self._write(batch)
            finally:
                with self._lock:
                    self._writing = False
                    self._wake.notify_all()

    @staticmethod
    def _write(batch: list[dict[str, Any]]) -> None:
        try:
            services.record_calls(batch)
        except Exception:
            logger.exception("recording %d tool calls failed", len(batch))
        finally:
            # This thread is not a request: honour CONN_MAX_AGE (and drop broken connections) here.
            close_old_connections()

    def _write_pending_at_exit(self) -> None:
        if not self.flush(timeout=5.0):
            logger.warning("tool call records still pending at exit")


recorder = CallRecorder()
atexit.register(recorder._write_pending_at_exit)
