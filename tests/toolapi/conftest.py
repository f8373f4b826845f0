"""Fixtures: real upstream MCP servers, server registration through the API, and a live ASGI server.

The live server runs config.asgi.application (the same object daphne serves, /api/mcp mount
included) under uvicorn in a thread of the test process, with ASGI lifespan turned off as daphne has
it. Being in-process, it shares the test database (also SQLite's in-memory one) and the settings
the tests override, and the tests can watch the upstreams react to it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from asgiref.sync import sync_to_async
from django.db import connections

from accounts.models import Role
from tests.conftest import Actor, make_actor
from tests.toolapi.upstreams import BetaState, Upstream, free_port, start_alpha, start_beta
from toolapi import catalog


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


@dataclass
class LiveApp:
    url: str
    server: uvicorn.Server
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop | None = None


def _start_live_app() -> LiveApp:
    from config.asgi import application

    port = free_port()
    config = uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    live = LiveApp(url=f"http://127.0.0.1:{port}", server=server, thread=threading.Thread(target=lambda: None))

    def run() -> None:
        live.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(live.loop)
        live.loop.run_until_complete(server.serve())

    live.thread = threading.Thread(target=run, name="live-app", daemon=True)
    live.thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not live.thread.is_alive():
            raise RuntimeError("live app did not start")
        time.sleep(0.01)
    return live


@pytest.fixture
def live_app(transactional_db: Any) -> Iterator[LiveApp]:
    live = _start_live_app()
    yield live
    if live.loop is not None:
        # Views ran their queries on asgiref's sync thread; close its connections before the test
        # database is flushed or dropped.
        asyncio.run_coroutine_threadsafe(sync_to_async(connections.close_all)(), live.loop).result(10)
    live.server.should_exit = True
    live.thread.join(timeout=15)
