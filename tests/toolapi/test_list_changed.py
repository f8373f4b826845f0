"""An upstream that announces a changed tool list is rediscovered without anyone asking for a refresh.

The upstream (gamma, a real MCP server on loopback) adds a tool while we hold a session to it and
announces it: as `notifications/tools/list_changed` on the session's standalone stream when it speaks
the initialize-handshake era, or on a `subscriptions/listen` stream at 2026-07-28. The new tool must
then show up in the caller's OpenAPI document and be callable, with no refresh request, no Celery beat
and no restart in between. An upstream that restarts with other tools, announcing nothing, must be
followed again too.

The rediscovery runs in a thread of whichever process holds the session, against the database, so
these tests commit their data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.conftest import Actor
from tests.live import LiveServer
from tests.toolapi.conftest import register, wait_for
from tests.toolapi.upstreams import GAMMA_SHOUT, GammaState, Upstream, restart_gamma, start_gamma
from toolapi.models import McpServer
from toolapi.upstream import hub

pytestmark = pytest.mark.django_db(transaction=True)

ERAS = {"handshake era": True, "2026-07-28": False}
SHOUT_PATH = "/api/mcp-httpapi/tools/gamma__shout"


@pytest.fixture(params=list(ERAS), ids=list(ERAS))
def gamma(request: pytest.FixtureRequest) -> Iterator[tuple[Upstream, GammaState]]:
    handshake_only = ERAS[request.param]
    upstream, state = start_gamma(handshake_only=handshake_only)
    try:
        yield upstream, state
    finally:
        # Open change streams hold the upstream's shutdown; the tests close their sessions, and
        # only one left behind by a failure is cut.
        wait_for(lambda: state.listening == 0, timeout=5)
        upstream.stop(force=state.listening > 0)
    # Every session really spoke the era under test (no silent fallback either way).
    expected = HANDSHAKE_PROTOCOL_VERSIONS if handshake_only else MODERN_PROTOCOL_VERSIONS
    assert state.listed_with, "the upstream was never asked for its tools"
    assert set(state.listed_with) <= set(expected), state.listed_with


def test_in_process_session_picks_up_an_announced_tool(owner: Actor, gamma: tuple[Upstream, GammaState]) -> None:
    upstream, state = gamma
    client = owner.client()
    server = register(owner, "gamma", upstream.url)
    assert server["health"] == "ok"
    assert server["toolCount"] == 1
    # Discovery left a session open in this process; it is listening once the upstream sees it.
    assert wait_for(lambda: state.listening > 0), "the session never opened its change channel"

    before = client.get("/api/mcp-httpapi/openapi.json").json()
    assert "/api/mcp-httpapi/tools/gamma__echo" in before["paths"]
    assert SHOUT_PATH not in before["paths"]
    assert client.post(SHOUT_PATH, data={"text": "hi"}, content_type="application/json").status_code == 404
    checked_before = McpServer.objects.get(pk=server["id"]).last_checked_at

    state.add_tool_and_announce(GAMMA_SHOUT)

    def announced_tool_is_published() -> bool:
        return SHOUT_PATH in client.get("/api/mcp-httpapi/openapi.json").json()["paths"]

    assert wait_for(announced_tool_is_published), "the announced tool never reached the OpenAPI document"
    document = client.get("/api/mcp-httpapi/openapi.json").json()
    operation = document["paths"][SHOUT_PATH]["post"]
    assert operation["operationId"] == "gamma__shout"
    assert operation["description"] == GAMMA_SHOUT.description
    assert operation["requestBody"]["content"]["application/json"]["schema"]["required"] == ["text"]

    response = client.post(SHOUT_PATH, data={"text": "hi"}, content_type="application/json")
    assert response.status_code == 200, response.content
    assert json.loads(response.json()["result"])["content"] == [{"type": "text", "text": "HI"}]

    refreshed = McpServer.objects.get(pk=server["id"])
    assert refreshed.health == "ok"
    assert refreshed.last_checked_at is not None and checked_before is not None
    assert refreshed.last_checked_at > checked_before
    assert sorted(refreshed.tools.values_list("name", flat=True)) == ["gamma__echo", "gamma__shout"]
    hub.close_server(server["id"])


def test_the_serving_process_picks_up_an_announced_tool(
    gamma: tuple[Upstream, GammaState], live_app: LiveServer, owner: Actor
) -> None:
    """The session that hears the announcement is the ASGI server's own (calls run on its loop).

    (gamma comes first so that it is stopped after the server process, whose session is then gone.)
    """
    upstream, state = gamma
    server = register(owner, "gamma", upstream.url)
    # Close this process's session from the registration, so only the server process can hear it.
    assert wait_for(lambda: state.listening > 0)
    hub.close_server(server["id"])
    assert wait_for(lambda: state.listening == 0), "this process's session did not close"

    with httpx.Client(base_url=live_app.url, headers=owner.auth, timeout=30) as client:
        echoed = client.post("/api/mcp-httpapi/tools/gamma__echo", json={"text": "hi"})
        assert echoed.status_code == 200, echoed.text
        assert json.loads(echoed.json()["result"])["content"] == [{"type": "text", "text": "hi"}]
        assert wait_for(lambda: state.listening > 0), "the server process's session never opened its change channel"
        assert SHOUT_PATH not in client.get("/api/mcp-httpapi/openapi.json").json()["paths"]

        state.add_tool_and_announce(GAMMA_SHOUT)

        def announced_tool_is_published() -> bool:
            response: Any = client.get("/api/mcp-httpapi/openapi.json")
            return SHOUT_PATH in response.json()["paths"]

        assert wait_for(announced_tool_is_published), f"not rediscovered; server log:\n{live_app.log()[-3000:]}"
        shouted = client.post(SHOUT_PATH, json={"text": "hi"})
        assert shouted.status_code == 200, shouted.text
        assert json.loads(shouted.json()["result"])["content"] == [{"type": "text", "text": "HI"}]


def test_a_restarted_upstream_is_heard_again(owner: Actor, gamma: tuple[Upstream, GammaState]) -> None:
    """An upstream that restarts, changed, is followed again: calls work and the new tool shows up.

    The restart cuts the change stream we held and, in the handshake era, the upstream forgets our
    session (404 to its id). Nobody was listening while it was down, so the tools must be fetched
    again without an announcement, and a call made right away must not fail on the old session.
    """
    upstream, state = gamma
    client = owner.client()
    server = register(owner, "gamma", upstream.url)
    assert wait_for(lambda: state.listening > 0)
    upstream.stop(force=True)
    state.tools.append(GAMMA_SHOUT)
    restart_gamma(upstream, state)

    echoed = client.post("/api/mcp-httpapi/tools/gamma__echo", data={"text": "back"}, content_type="application/json")
    assert echoed.status_code == 200, echoed.content
    assert json.loads(echoed.json()["result"])["content"] == [{"type": "text", "text": "back"}]

    def new_tool_is_published() -> bool:
        return SHOUT_PATH in client.get("/api/mcp-httpapi/openapi.json").json()["paths"]

    assert wait_for(new_tool_is_published, timeout=15), "the restarted upstream's tools were not fetched again"
    shouted = client.post(SHOUT_PATH, data={"text": "back"}, content_type="application/json")
    assert shouted.status_code == 200, shouted.content
    assert json.loads(shouted.json()["result"])["content"] == [{"type": "text", "text": "BACK"}]
    # And the change channel is open again, so the next announcement is heard too.
    assert wait_for(lambda: state.listening > 0)
    hub.close_server(server["id"])
