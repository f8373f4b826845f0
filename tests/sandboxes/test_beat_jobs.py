"""Credential refresh and the inactivity reaper, run by a real Celery beat and worker on the configured
broker (Redis in CI), against sandboxes created through a live server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from accounts.models import Organization
from audit.models import AuditEvent, EventType
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from tests.conftest import Actor
from tests.live import CeleryProcess, LiveServer, start_celery, start_live_server, stop_live_server, stop_process
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Short lives so the jobs act within seconds: tokens live 8 s and are renewed with 5 s left; sandboxes
# idle for 4 s are reaped; long operations refresh activity every second. Two sandboxes per
# organization, so whether a reaped sandbox's slot is free shows in whether a create succeeds.
FAST = {
    "SANDBOX_MAX_PER_ORG": "2",
    "SANDBOX_API_TOKEN_SECONDS": "8",
    "SANDBOX_CREDENTIALS_MARGIN_SECONDS": "5",
    "SANDBOX_CREDENTIALS_REFRESH_SECONDS": "1",
    "SANDBOX_IDLE_SECONDS": "4",
    "SANDBOX_REAPER_SECONDS": "1",
    "SANDBOX_ACTIVITY_HEARTBEAT_SECONDS": "1",
}


@dataclass
class Stack:
    server: LiveServer
    worker: CeleryProcess
    beat: CeleryProcess
    client: httpx.Client
    organization_id: str

    def logs(self) -> str:
        return f"--- server\n{self.server.log()[-3000:]}\n--- worker\n{self.worker.log()[-3000:]}\n--- beat\n{self.beat.log()[-2000:]}"


@pytest.fixture
def stack(owner: Actor) -> Iterator[Stack]:
    Organization.objects.filter(pk=owner.organization.pk).update(sandboxes_enabled=True)
    server = start_live_server(FAST)
    env = {**FAST, "PORT": str(server.port), "BASE_URL": server.url}
    worker = start_celery("worker", env)
    beat = start_celery("beat", env)
    client = httpx.Client(base_url=server.url, headers=owner.auth, timeout=60)
    try:
        yield Stack(server, worker, beat, client, owner.organization.pk)
    finally:
        client.close()
        stop_process(beat.process)
        stop_process(worker.process)
        stop_live_server(server)
        for sandbox in Sandbox.objects.filter(status=SandboxStatus.RUNNING):
            get_runtime().destroy(sandbox.pk)


def _config(client: httpx.Client, sandbox_id: str) -> dict[str, str]:
    return json.loads(stdout_of(exec_lines(client, sandbox_id, "cat ~/.svc.config")))


def test_tokens_are_refreshed_before_they_expire(stack: Stack) -> None:
    client = stack.client
    sandbox_id = client.post("/api/v1/sandboxes").json()["id"]
    first = _config(client, sandbox_id)["token"]
    try:
        second = wait_for(lambda: (t := _config(client, sandbox_id)["token"]) != first and t, timeout=20)
    except AssertionError:
        raise AssertionError(stack.logs()) from None
    # The next exec sees the new token in its environment.
    assert stdout_of(exec_lines(client, sandbox_id, "printf %s $SVC_API_KEY")) == _config(client, sandbox_id)["token"]
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {second}"}).status_code == 200
    # The old token keeps working until its own expiry, then stops.
    wait_for(
        lambda: client.get("/api/v1/me", headers={"Authorization": f"Bearer {first}"}).status_code == 401, timeout=20
    )
    assert AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_ISSUED).count() >= 2


def test_idle_sandboxes_are_reaped_and_busy_ones_are_not(stack: Stack) -> None:
    client = stack.client
    idle = client.post("/api/v1/sandboxes").json()["id"]
    busy = client.post("/api/v1/sandboxes").json()["id"]
    home = get_runtime().inspect(idle)
    assert home is not None
    full = client.post("/api/v1/sandboxes")
    assert full.status_code == 409 and full.json()["error"]["code"] == "sandbox_limit_reached"
    started = time.monotonic()
    # A single exec that runs well past the idle limit: it counts as activity while it runs.
    lines = exec_lines(client, busy, "sleep 9; echo still-here")
    assert time.monotonic() - started >= 9
    assert stdout_of(lines) == "still-here\n"
    # The busy one survived an exec more than twice the idle limit long.
    assert Sandbox.objects.get(pk=busy).status == SandboxStatus.RUNNING
    try:
        reaped = wait_for(lambda: Sandbox.objects.get(pk=idle).status == SandboxStatus.DESTROYED, timeout=20)
    except AssertionError:
        raise AssertionError(stack.logs()) from None
    assert reaped
    sandbox = Sandbox.objects.get(pk=idle)
    assert sandbox.destroy_reason == "inactivity"
    assert get_runtime().inspect(idle) is None, "processes and directory are gone"
    event = AuditEvent.objects.get(sandbox_id=idle, event_type=EventType.SANDBOX_DESTROY)
    assert event.data["reason"] == "inactivity"
    # The slot is free at once: the organization holds only the busy sandbox, and may create again.
    active = Sandbox.objects.filter(organization_id=stack.organization_id, status__in=ACTIVE_STATUSES)
    assert list(active.values_list("pk", flat=True)) == [busy]
    again = client.post("/api/v1/sandboxes")
    assert again.status_code == 201, again.text
