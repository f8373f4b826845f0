"""The warm pool: a live server keeping sandboxes started ahead of demand."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from audit.models import AuditEvent, EventType
from sandboxes import services
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.pool import new_sandbox_id
from sandboxes.runtime import get_runtime
from sandboxes.runtimes.base import SandboxState
from sandboxes.runtimes.local import LocalRuntime
from tests.conftest import Actor
from tests.live import LiveServer, start_live_server, stop_live_server
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for
from tests.sandboxes.test_credentials import CALL

pytestmark = pytest.mark.django_db(transaction=True)

POOL_SIZE = 2


def _runtime() -> LocalRuntime:
    runtime = get_runtime()
    assert isinstance(runtime, LocalRuntime)
    return runtime


def _pooled_ids() -> set[str]:
    return {info.sandbox_id for info in get_runtime().list() if info.pooled}


def _full_pool() -> list[str]:
    return wait_for(lambda: (ready := _runtime().pool_ready()) and len(ready) == POOL_SIZE and ready, timeout=60)


@pytest.fixture
def pooled_live(transactional_db: None) -> Iterator[LiveServer]:
    server = start_live_server({"SANDBOX_WARM_POOL_SIZE": str(POOL_SIZE)})
    try:
        yield server
    finally:
        stop_live_server(server)
        # Whatever the server's own shutdown left (it drains the pool) must not reach the next test.
        _runtime().drain_pool()
        for sandbox in Sandbox.objects.filter(status=SandboxStatus.RUNNING):
            get_runtime().destroy(sandbox.pk)


@pytest.fixture
def pooled_api(pooled_live: LiveServer, enabled: Actor) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pooled_live.url, headers=enabled.auth, timeout=120) as client:
        yield client


def test_a_claimed_pool_sandbox_behaves_like_a_cold_one(pooled_api: httpx.Client) -> None:
    pool = _full_pool()
    created = pooled_api.post("/api/v1/sandboxes")
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    assert sandbox_id in pool, "the create claimed a pool member"
    assert sandbox_id.startswith("sbx_") and created.json()["status"] == "running"

    info = get_runtime().inspect(sandbox_id)
    assert info is not None and info.state == SandboxState.RUNNING and not info.pooled
    assert stdout_of(exec_lines(pooled_api, sandbox_id, "hostname")).strip() == sandbox_id
    home = stdout_of(exec_lines(pooled_api, sandbox_id, "ls -A ~")).split()
    skel = sorted(entry.name for entry in os.scandir("/etc/skel") if entry.is_file() and not entry.is_symlink())
    assert sorted(home) == sorted([*skel, ".svc.config"]), "a fresh home: skeleton files and credentials only"

    config = json.loads(stdout_of(exec_lines(pooled_api, sandbox_id, "cat ~/.svc.config")))
    assert config["sandboxId"] == sandbox_id
    lines = exec_lines(pooled_api, sandbox_id, CALL)
    result = json.loads(stdout_of(lines))
    assert result["me"][0] == 200 and result["same"] is True
    assert result["write"][0] == 403
    assert AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.SANDBOX_CREATE).count() == 1

    # Refilled in the background with new members.
    refilled = _full_pool()
    assert sandbox_id not in refilled
    assert pooled_api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    assert get_runtime().inspect(sandbox_id) is None


def test_pool_members_are_invisible_and_count_against_no_limit(pooled_api: httpx.Client, outsider: Actor) -> None:
    pool = _full_pool()
    assert pooled_api.get("/api/v1/sandboxes").json()["results"] == []
    for member in pool:
        assert pooled_api.get(f"/api/v1/sandboxes/{member}").status_code == 404
        ran = pooled_api.post(f"/api/v1/sandboxes/{member}/exec", json={"command": "true"})
        assert ran.status_code == 404 and ran.json()["error"]["code"] == "not_found"
        assert not Sandbox.objects.filter(pk=member).exists()
    # Ten creates succeed with members waiting in the pool; the eleventh meets the limit as always.
    ids = []
    for _ in range(10):
        response = pooled_api.post("/api/v1/sandboxes")
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    refused = pooled_api.post("/api/v1/sandboxes")
    assert refused.status_code == 409 and refused.json()["error"]["details"] == {"limit": 10, "active": 10}
    assert len(set(ids)) == 10
    assert set(pool) <= set(ids), "the waiting members were used first"
    assert {s["id"] for s in pooled_api.get("/api/v1/sandboxes").json()["results"]} == set(ids)


def test_concurrent_creates_never_share_a_pool_member(pooled_api: httpx.Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = _full_pool()
    with ThreadPoolExecutor(max_workers=8) as executor:
        responses = list(executor.map(lambda _: pooled_api.post("/api/v1/sandboxes"), range(8)))
    assert [r.status_code for r in responses] == [201] * 8
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == 8
    assert set(pool) <= set(ids)
    for sandbox_id in ids:
        assert stdout_of(exec_lines(pooled_api, sandbox_id, "hostname")).strip() == sandbox_id


def test_reconcile_leaves_the_pool_alone_but_removes_dead_members(pooled_api: httpx.Client) -> None:
    first, second = _full_pool()
    runtime = _runtime()
    orphan = runtime.create(new_sandbox_id())
    try:
        result = services.reconcile()
        assert orphan.sandbox_id in result["orphans"]
        assert first not in result["orphans"] and second not in result["orphans"]
        assert set(runtime.pool_ready()) == {first, second}

        # A member whose processes died can serve nobody: reconciliation destroys it.
        state = runtime._read_state(runtime.root / first)
        assert state is not None
        os.kill(state["initPid"], signal.SIGKILL)
        wait_for(lambda: (info := runtime.inspect(first)) is not None and info.state == SandboxState.EXITED)
        result = services.reconcile()
        assert first in result["unhealthyPool"] and second not in result["unhealthyPool"]
        assert runtime.inspect(first) is None
        info = runtime.inspect(second)
        assert info is not None and info.pooled and info.state == SandboxState.RUNNING

        # Just claimed, its row not committed yet: not an orphan.
        claimed = runtime.claim(second)
        assert claimed is not None
        assert second not in services.reconcile()["orphans"]
        assert runtime.inspect(second) is not None
        runtime.destroy(second)
    finally:
        runtime.destroy(orphan.sandbox_id)


def test_the_server_drains_its_pool_when_it_stops(enabled: Actor, transactional_db: None) -> None:
    server = start_live_server({"SANDBOX_WARM_POOL_SIZE": str(POOL_SIZE)})
    try:
        pool = _full_pool()
    finally:
        stop_live_server(server)
    try:
        # Stopped by SIGTERM, exactly as without a pool.
        assert server.process.returncode == -signal.SIGTERM, server.log()
        for member in pool:
            assert get_runtime().inspect(member) is None
        assert _pooled_ids() == set()
    finally:
        _runtime().drain_pool()


def test_pool_off_means_cold_starts_with_fresh_ids(api: httpx.Client) -> None:
    started = time.time()
    response = api.post("/api/v1/sandboxes")
    assert response.status_code == 201
    info = get_runtime().inspect(response.json()["id"])
    assert info is not None and info.handle is not None and info.handle.created_at >= started
    assert _pooled_ids() == set()
