"""Fixtures for tests that drive real sandboxes through a live server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from accounts.models import Organization
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from tests.conftest import Actor
from tests.live import LiveServer


@pytest.fixture
def enabled(owner: Actor) -> Actor:
    Organization.objects.filter(pk=owner.organization.pk).update(sandboxes_enabled=True)
    return owner


@pytest.fixture
def api(live: LiveServer, enabled: Actor) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, headers=enabled.auth, timeout=120) as client:
        yield client
    # No test leaves sandboxes running behind it.
    for sandbox in Sandbox.objects.filter(status=SandboxStatus.RUNNING):
        get_runtime().destroy(sandbox.pk)


@pytest.fixture
def sandbox_id(api: httpx.Client) -> str:
    response = api.post("/api/v1/sandboxes")
    assert response.status_code == 201, response.text
    sandbox_id = str(response.json()["id"])
    # The create answers while the credentials are still being fetched (commands wait for them);
    # tests start from a sandbox whose credentials are recorded, as they are a moment later.
    wait_for(lambda: credentials_settled(api, sandbox_id))
    return sandbox_id


def credentials_settled(api: httpx.Client, sandbox_id: str) -> bool:
    credentials = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()["credentials"]
    return bool(credentials["expiresAt"] or credentials["error"])


def exec_lines(api: httpx.Client, sandbox_id: str, command: str, **fields: Any) -> list[dict[str, Any]]:
    import json

    response = api.post(f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": command, **fields})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def stdout_of(lines: list[dict[str, Any]]) -> str:
    return "".join(line["data"] for line in lines if line["type"] == "stdout")


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")
