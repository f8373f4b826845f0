"""Fixtures: real upstream MCP servers (threads of the test process), server registration through the
API, and a live uvicorn process for streaming, cancellation and the /api/mcp endpoint.

The upstreams run in the test process, so tests can watch them react (headers received, a slow tool
noticing cancellation) to calls made by the uvicorn process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accounts.models import Role
from tests.conftest import Actor, make_actor
from tests.live import LiveServer, start_live_server, stop_live_server
from tests.toolapi.upstreams import BetaState, Upstream, start_alpha, start_beta
from toolapi import catalog


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="session")
def alpha() -> Iterator[Upstream]:
    upstream = start_alpha()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="session")
def beta_pair() -> Iterator[tuple[Upstream, BetaState]]:
    upstream, state = start_beta()
    yield upstream, state
    upstream.stop()


@pytest.fixture
def beta(beta_pair: tuple[Upstream, BetaState]) -> Upstream:
    return beta_pair[0]


@pytest.fixture(autouse=True)
def _fresh_document_cache() -> Iterator[None]:
    # Fingerprints include database timestamps; a fresh cache per test keeps tests independent.
    catalog.clear_cache()
    yield
    catalog.clear_cache()


def register(actor: Actor, name: str, url: str, **extra: Any) -> dict[str, Any]:
    response = actor.client().post(
        "/api/v1/mcp-servers", data={"name": name, "url": url, **extra}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def sandbox_actor(owner: Actor) -> Actor:
    """The owner acting through a sandbox's read-only token."""
    return make_actor("acme", "owner@acme.test", Role.OWNER, read_only=True)


@pytest.fixture
def live_app(transactional_db: Any) -> Iterator[LiveServer]:
    """uvicorn serving config.asgi.application in a subprocess (as `make run` does), with 1 s keepalives."""
    server = start_live_server(extra_env={"TOOLAPI_KEEPALIVE_SECONDS": "1"})
    try:
        yield server
    finally:
        stop_live_server(server)
