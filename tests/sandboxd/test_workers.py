"""Kept worker threads: reused when idle, added for a burst, retired after a quiet while."""

from __future__ import annotations

import threading
import time

import pytest

from sandboxd.workers import Workers


def _named(prefix: str) -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == prefix and t.ident is not None}


def test_an_idle_worker_takes_the_next_job_and_a_burst_gets_threads_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Workers, "IDLE_SECONDS", 0.5)
    ran: list[int] = []
    release = threading.Event()
    done = threading.Semaphore(0)

    def handle(job: str) -> None:
        if job == "block":
            release.wait(10)
        ran.append(threading.get_ident())
        done.release()

    workers = Workers(handle, name="test-workers")
    workers.dispatch("first")
    assert done.acquire(timeout=5)
    time.sleep(0.05)  # the worker is back waiting
    workers.dispatch("second")
    assert done.acquire(timeout=5)
    assert ran[0] == ran[1], "an idle worker took the job; no thread was started for it"

    # Three jobs that block at once: each needs a thread, none waits for another to finish.
    for _ in range(3):
        workers.dispatch("block")
    time.sleep(0.2)
    assert len(_named("test-workers")) == 3
    release.set()
    for _ in range(3):
        assert done.acquire(timeout=5)

    # Quiet for longer than IDLE_SECONDS: the burst leaves no threads behind.
    deadline = time.monotonic() + 5
    while _named("test-workers") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _named("test-workers")
    # And work still gets done afterwards.
    workers.dispatch("after")
    assert done.acquire(timeout=5)
