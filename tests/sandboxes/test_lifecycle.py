"""Sandbox lifecycle through the HTTP API, on real sandboxes."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from django.db import connection

from accounts.models import Organization
from accounts.services import create_token
from audit.models import AuditEvent, EventType
from common.errors import ApiError
from sandboxes import services
from sandboxes.api.streaming import TOUCH_INTERVAL_SECONDS
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from sandboxes.runtimes.base import SandboxState
from tests.conftest import Actor
from tests.live import LiveServer
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_get_list_destroy(api: httpx.Client, enabled: Actor) -> None:
    created = api.post("/api/v1/sandboxes")
    assert created.status_code == 201, created.text
    body = created.json()
    sandbox_id = body["id"]
    assert body["status"] == "running"
    assert body["createdBy"]["email"] == enabled.user.email
    assert body["limits"]["cpus"] == 1.0 and body["limits"]["memoryBytes"] == 1024**3
    assert {limit["name"] for limit in body["limits"]["enforcement"]} >= {"cpu", "memory", "pids"}
    assert body["createdAt"] and body["lastActivityAt"] and body["idleExpiresAt"]

    info = get_runtime().inspect(sandbox_id)
    assert info is not None and info.state == SandboxState.RUNNING

    assert api.get(f"/api/v1/sandboxes/{sandbox_id}").json()["id"] == sandbox_id
    assert [s["id"] for s in api.get("/api/v1/sandboxes").json()["results"]] == [sandbox_id]

    assert api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    assert get_runtime().inspect(sandbox_id) is None, "processes and state are gone"
    detail = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()
    assert detail["status"] == "destroyed" and detail["destroyReason"] == "user"
    assert api.get("/api/v1/sandboxes").json()["results"] == []
    assert [s["id"] for s in api.get("/api/v1/sandboxes?status=all").json()["results"]] == [sandbox_id]
    # Idempotent delete; operations on a destroyed sandbox say why they cannot run.
    assert api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    gone = api.post(f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": "true"})
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "sandbox_destroyed"

    types = list(AuditEvent.objects.filter(sandbox_id=sandbox_id).values_list("event_type", flat=True))
    assert types.count(EventType.SANDBOX_CREATE) == 1 and types.count(EventType.SANDBOX_DESTROY) == 1
    # The audit log outlives the sandbox.
    assert api.get(f"/api/v1/sandboxes/{sandbox_id}/audit-logs").status_code == 200


def test_a_sandbox_destroyed_by_another_process_answers_410_at_once(api: httpx.Client, sandbox_id: str) -> None:
    # The web process remembers running sandboxes for a moment; a destroy made elsewhere (here this
    # test process, in production the reaper in the worker) must still be answered 410 right away.
    assert stdout_of(exec_lines(api, sandbox_id, "echo warm")) == "warm\n"
    assert api.post(f"/api/v1/sandboxes/{sandbox_id}/read-file", params={"path": "/etc/hostname"}).status_code == 200
    services.destroy_sandbox(sandbox=Sandbox.objects.get(pk=sandbox_id), reason="inactivity")
    for operation, request in (
        ("exec", {"json": {"command": "true"}}),
        ("read-file", {"params": {"path": "/etc/hostname"}}),
        (
            "write-file",
            {"params": {"path": "/tmp/x"}, "content": b"x", "headers": {"Content-Type": "application/octet-stream"}},
        ),
    ):
        gone = api.post(f"/api/v1/sandboxes/{sandbox_id}/{operation}", **request)
        assert gone.status_code == 410, (operation, gone.text)
        assert gone.json()["error"]["details"]["destroyReason"] == "inactivity"


def test_sandboxes_must_be_enabled(live: LiveServer, owner: Actor) -> None:
    response = httpx.post(f"{live.url}/api/v1/sandboxes", headers=owner.auth, timeout=30)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "sandboxes_not_enabled"
    assert not Sandbox.objects.exists()


def test_read_only_token_cannot_create_or_exec(api: httpx.Client, enabled: Actor, sandbox_id: str) -> None:
    issued = create_token(user=enabled.user, organization=enabled.organization, read_only=True)
    headers = {"Authorization": f"Bearer {issued.raw}"}
    created = api.post("/api/v1/sandboxes", headers=headers)
    assert created.status_code == 403 and created.json()["error"]["code"] == "read_only_token"
    ran = api.post(f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": "true"}, headers=headers)
    assert ran.status_code == 403 and ran.json()["error"]["code"] == "read_only_token"
    assert api.get(f"/api/v1/sandboxes/{sandbox_id}", headers=headers).status_code == 200


def test_other_organizations_get_404_everywhere(api: httpx.Client, sandbox_id: str, outsider: Actor) -> None:
    foreign = {"Authorization": f"Bearer {outsider.token}"}
    Organization.objects.filter(pk=outsider.organization.pk).update(sandboxes_enabled=True)
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", f"/api/v1/sandboxes/{sandbox_id}", {}),
        ("DELETE", f"/api/v1/sandboxes/{sandbox_id}", {}),
        ("POST", f"/api/v1/sandboxes/{sandbox_id}/exec", {"json": {"command": "true"}}),
        ("POST", f"/api/v1/sandboxes/{sandbox_id}/read-file?path=/etc/hostname", {}),
        (
            "POST",
            f"/api/v1/sandboxes/{sandbox_id}/write-file?path=/tmp/x",
            {"content": b"x", "headers": {**foreign, "Content-Type": "application/octet-stream"}},
        ),
        ("GET", f"/api/v1/sandboxes/{sandbox_id}/audit-logs", {}),
    ]
    for method, url, extra in calls:
        extra.setdefault("headers", foreign)
        response = api.request(method, url, **extra)
        assert response.status_code == 404, (method, url, response.text)
        assert response.json()["error"]["code"] == "not_found"
    assert Sandbox.objects.get(pk=sandbox_id).status == SandboxStatus.RUNNING
    assert api.get("/api/v1/sandboxes", headers=foreign).json()["results"] == []


def test_limit_of_ten_and_a_slot_frees_on_destroy(api: httpx.Client, enabled: Actor) -> None:
    ids = []
    for _ in range(10):
        response = api.post("/api/v1/sandboxes")
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    refused = api.post("/api/v1/sandboxes")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "sandbox_limit_reached" and error["details"] == {"limit": 10, "active": 10}
    assert api.delete(f"/api/v1/sandboxes/{ids[0]}").status_code == 204
    assert api.post("/api/v1/sandboxes").status_code == 201


def test_fifty_concurrent_creates_make_exactly_ten(api: httpx.Client, enabled: Actor) -> None:
    def create(_: int) -> int:
        return api.post("/api/v1/sandboxes").status_code

    with ThreadPoolExecutor(max_workers=25) as pool:
        statuses = list(pool.map(create, range(50)))
    assert statuses.count(201) == 10, statuses
    assert statuses.count(409) == 40, statuses
    assert Sandbox.objects.filter(status=SandboxStatus.RUNNING).count() == 10
    running = [info for info in get_runtime().list() if info.state == SandboxState.RUNNING]
    assert len(running) == 10


def test_concurrent_service_calls_respect_the_limit(enabled: Actor) -> None:
    """The same race one level down, each thread on its own database connection (real row locks)."""
    from common.principal import Principal

    principal = Principal(user=enabled.user, organization=enabled.organization, role="owner", token=None)

    def create(_: int) -> str:
        try:
            return services.create_sandbox(principal=principal).status
        except ApiError as exc:
            return exc.code
        finally:
            connection.close()

    try:
        with ThreadPoolExecutor(max_workers=12) as pool:
            results = list(pool.map(create, range(30)))
        assert results.count("running") == 10, results
        assert results.count("sandbox_limit_reached") == 20, results
    finally:
        for sandbox in Sandbox.objects.filter(status=SandboxStatus.RUNNING):
            get_runtime().destroy(sandbox.pk)


def test_reconcile_marks_vanished_and_destroys_orphans(api: httpx.Client, enabled: Actor, sandbox_id: str) -> None:
    runtime = get_runtime()
    # Killed from outside the service: the database must learn it and free the slot.
    runtime.destroy(sandbox_id)
    orphan = runtime.create("sbx_orphan_test")
    try:
        result = services.reconcile()
        # Membership, not equality: the runtime root is shared by the whole test session.
        assert sandbox_id in result["vanished"]
        assert "sbx_orphan_test" in result["orphans"]
        sandbox = Sandbox.objects.get(pk=sandbox_id)
        assert sandbox.status == SandboxStatus.DESTROYED and sandbox.destroy_reason == "vanished"
        assert runtime.inspect(orphan.sandbox_id) is None
    finally:
        runtime.destroy("sbx_orphan_test")


def test_exec_updates_last_activity(api: httpx.Client, sandbox_id: str) -> None:
    before = Sandbox.objects.get(pk=sandbox_id).last_activity_at
    # The create recorded activity just now; a process writes it at most once a second per sandbox.
    time.sleep(TOUCH_INTERVAL_SECONDS + 0.1)
    assert stdout_of(exec_lines(api, sandbox_id, "echo hi")) == "hi\n"
    after = wait_for(lambda: Sandbox.objects.get(pk=sandbox_id).last_activity_at > before)
    assert after
