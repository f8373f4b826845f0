"""Warm-pool primitives of the local runtime: fill, claim exactly once (threads and processes), drain."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandboxes.runtimes.base import SandboxState
from sandboxes.runtimes.local import LocalRuntime, LocalRuntimeConfig
from tests.runtimes.conftest import new_sandbox_id

ROOT = Path(__file__).resolve().parents[2]

# Another process sharing the runtime root: it claims once and prints what it got.
CLAIMER = """
import sys
from pathlib import Path
from sandboxes.runtimes.local import LocalRuntime, LocalRuntimeConfig
runtime = LocalRuntime(LocalRuntimeConfig(root=Path(sys.argv[1])))
sys.stdin.readline()  # start together
handle = runtime.claim()
print(handle.sandbox_id if handle else "none", flush=True)
"""


@pytest.fixture
def drained(local_runtime: LocalRuntime) -> Iterator[LocalRuntime]:
    yield local_runtime
    local_runtime.drain_pool()


def test_pool_members_are_ordinary_sandboxes_marked_pooled(drained: LocalRuntime) -> None:
    assert drained.fill_pool(2, lambda: new_sandbox_id("w")) == 2
    ready = drained.pool_ready()
    assert len(ready) == 2
    for member in ready:
        info = drained.inspect(member)
        assert info is not None and info.state == SandboxState.RUNNING
        assert info.pooled and info.claimed_at is None
    assert {i.sandbox_id for i in drained.list() if i.pooled} == set(ready)
    # Full already: a second filler (another process, a retry) starts nothing.
    assert drained.fill_pool(2, lambda: new_sandbox_id("w")) == 0

    handle = drained.claim()
    assert handle is not None and handle.sandbox_id in ready
    info = drained.inspect(handle.sandbox_id)
    assert info is not None and not info.pooled and info.claimed_at is not None
    assert info.state == SandboxState.RUNNING
    assert drained.claim(handle.sandbox_id) is None, "claimed once only"
    drained.destroy(handle.sandbox_id)

    # An ordinary sandbox is never claimable.
    ordinary = drained.create(new_sandbox_id("o"))
    try:
        assert drained.claim(ordinary.sandbox_id) is None
    finally:
        drained.destroy(ordinary.sandbox_id)

    assert drained.drain_pool() == [m for m in ready if m != handle.sandbox_id]
    assert drained.pool_ready() == []
    assert all(not info.pooled for info in drained.list())


def test_concurrent_claims_from_threads_and_processes_never_share_a_member(
    drained: LocalRuntime, runtime_root: Path
) -> None:
    size = 4
    drained.fill_pool(size, lambda: new_sandbox_id("w"))
    members = set(drained.pool_ready())
    assert len(members) == size

    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(runtime_root)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    barrier = threading.Barrier(4 + 1)

    def claim_in_thread(_: int) -> str:
        barrier.wait()
        handle = drained.claim()
        return handle.sandbox_id if handle else "none"

    with ThreadPoolExecutor(max_workers=4) as executor:
        futures = [executor.submit(claim_in_thread, i) for i in range(4)]
        barrier.wait()
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [future.result() for future in futures]
    for process in processes:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        results.append(out.strip())
    claimed = [r for r in results if r != "none"]
    try:
        assert len(claimed) == size, results
        assert set(claimed) == members, "each member claimed exactly once"
    finally:
        for sandbox_id in claimed:
            drained.destroy(sandbox_id)


def test_fill_stops_when_asked(drained: LocalRuntime) -> None:
    assert drained.fill_pool(3, lambda: new_sandbox_id("w"), stop=lambda: True) == 0
    assert drained.pool_ready() == []


def test_a_new_runtime_instance_finds_the_pool(drained: LocalRuntime, runtime_root: Path) -> None:
    drained.fill_pool(1, lambda: new_sandbox_id("w"))
    (member,) = drained.pool_ready()
    other = LocalRuntime(LocalRuntimeConfig(root=runtime_root))
    handle = other.claim()
    assert handle is not None and handle.sandbox_id == member
    drained.destroy(member)
