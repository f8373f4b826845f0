"""A small per-process cache whose entries live a bounded number of seconds.

Used for lookups on the hottest request paths (a bearer token's principal, a running sandbox's
daemon address), where the database answer may be a second or two old without harm, and where
whoever changes the answer in this process drops the entries at once (``forget``/``discard``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(
        self, ttl: Callable[[], float], *, max_entries: int = 10_000, valid: Callable[[V], bool] | None = None
    ) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._valid = valid
        self._entries: dict[K, tuple[V, float]] = {}
        self._lock = threading.Lock()
        # Bumped by forget() and discard(): a lookup that started before an invalidation must not
        # store what it read (it may be the state just invalidated).
        self.generation = 0

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires = entry
        if time.monotonic() >= expires or (self._valid is not None and not self._valid(value)):
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            return None
        return value

    def put(self, key: K, value: V, generation: int) -> None:
        """Store ``value``, read when ``generation`` was current, unless it was invalidated since."""
        ttl = self._ttl()
        if ttl <= 0:
            return
        with self._lock:
            if generation != self.generation:
                return
            if len(self._entries) >= self._max:
                now = time.monotonic()
                self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
                if len(self._entries) >= self._max:
                    self._entries.clear()
            self._entries[key] = (value, time.monotonic() + ttl)

    def discard(self, key: K) -> None:
        with self._lock:
            self.generation += 1
            self._entries.pop(key, None)

    def invalidate_pending(self) -> None:
        """Invalidate lookups under way (see ``put``) without dropping any entry."""
        with self._lock:
            self.generation += 1

    def forget(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()
