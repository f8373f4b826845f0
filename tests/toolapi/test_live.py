"""Against a live uvicorn: SSE framing, cancellation on disconnect, and the aggregated MCP endpoint."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import Actor
from tests.live import LiveServer
from tests.toolapi.conftest import register, wait_for
from tests.toolapi.upstreams import Upstream
from toolapi.models import CallChannel, CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_sse_framing_byte_for_byte(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    chunks: list[tuple[float, bytes]] = []
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{live_app.url}/api/mcp-httpapi/tools/alpha__slow",
        json={"seconds": 2.5},
        headers={**owner.auth, "Accept": "text/event-stream"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["cache-control"] == "no-cache"
        for chunk in response.iter_raw():
            chunks.append((time.monotonic() - started, chunk))
    body = b"".join(chunk for _, chunk in chunks)
    payload = compact(
        {"content": [{"type": "text", "text": "slept 2.5"}], "structuredContent": {"result": "slept 2.5"}}
    )
    event = compact({"result": payload, "isError": False})
    assert body == b": keepalive\n\n: keepalive\n\ndata: " + event.encode() + b"\n\n"
    # Keepalives arrive while the tool runs, one per (test) second, not all at the end.
    first_keepalive = next(at for at, chunk in chunks if chunk.startswith(b": keepalive"))
    assert 0.8 < first_keepalive < 2.0
    audit = ToolCall.objects.get()
    assert (audit.channel, audit.status) == (CallChannel.SSE, CallStatus.OK)
    assert audit.response_bytes == len(body)


def test_sse_validation_errors_are_plain_json(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    response = httpx.post(
        f"{live_app.url}/api/mcp-httpapi/tools/alpha__slow",
        json={"seconds": "soon"},
        headers={**owner.auth, "Accept": "text/event-stream"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"][0]["path"] == "/seconds"


@pytest.mark.parametrize("accept", ["text/event-stream", "application/json"])
def test_client_disconnect_cancels_the_upstream_call(
    live_app: LiveServer, owner: Actor, alpha: Upstream, accept: str
) -> None:
    register(owner, "alpha", alpha.url)
    alpha.events.clear()

    def caller() -> None:
        try:
            with httpx.stream(
                "POST",
                f"{live_app.url}/api/mcp-httpapi/tools/alpha__slow",
                json={"seconds": 20},
                headers={**owner.auth, "Accept": accept},
                timeout=httpx.Timeout(10, read=1.5),
            ) as response:
                for _ in response.iter_raw():
                    break  # the first keepalive: the call is under way; leave
        except httpx.ReadTimeout:
            pass  # the JSON variant gives up waiting and closes the connection

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(30)
    assert "slow:started" in alpha.events
    assert alpha.wait_for_event("slow:cancelled"), alpha.events
    assert "slow:finished" not in alpha.events
    assert wait_for(lambda: ToolCall.objects.filter(status=CallStatus.CANCELLED).exists())


async def _mcp(url: str, auth: dict[str, str], work: Any) -> Any:
    async with create_mcp_http_client(headers=auth) as http:
        async with Client(streamable_http_client(f"{url}/api/mcp", http_client=http)) as client:
            return await work(client)


def test_mcp_endpoint_requires_a_token(live_app: LiveServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(f"{live_app.url}/api/mcp", json={}, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"]["code"] in {"not_authenticated", "authentication_failed"}


def test_mcp_endpoint_lists_and_calls_the_callers_tools(
    live_app: LiveServer, owner: Actor, outsider: Actor, alpha: Upstream, beta: Upstream
) -> None:
    register(owner, "alpha", alpha.url)
    register(owner, "beta", beta.url)
    reported: list[float] = []

    async def work(client: Client) -> dict[str, Any]:
        listing = await client.list_tools()
        added = await client.call_tool("beta__add", {"a": 2, "b": 5})
        summed = await client.call_tool("alpha__add", {"a": 2, "b": 5})

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reported.append(progress)

        slow = await client.call_tool("alpha__slow", {"seconds": 0.5}, progress_callback=on_progress)
        invalid = await client.call_tool("alpha__pick_color", {"color": "purple"})
        failed = await client.call_tool("alpha__fail", {})
        return {
            "names": sorted(tool.name for tool in listing.tools),
            "schemas": {tool.name: tool.input_schema for tool in listing.tools},
            "added": added,
            "summed": summed,
            "slow": slow,
            "invalid": invalid,
            "failed": failed,
        }

    seen = asyncio.run(_mcp(live_app.url, owner.auth, work))
    assert "alpha__pick_color" in seen["names"] and "beta__register" in seen["names"]
    assert seen["schemas"]["alpha__pick_color"]["properties"]["color"]["enum"] == ["red", "green", "blue"]
    assert seen["added"].content[0].text == "beta:7"
    assert seen["summed"].structured_content == {"result": 7}
    assert seen["slow"].content[0].text == "slept 0.5"
    assert reported and reported[-1] == 5
    assert seen["invalid"].is_error is True
    assert "enum" in seen["invalid"].content[0].text
    assert seen["failed"].is_error is True
    channels = set(ToolCall.objects.values_list("channel", flat=True))
    assert channels == {CallChannel.MCP}
    assert ToolCall.objects.filter(status=CallStatus.INVALID).count() == 1

    async def outsider_view(client: Client) -> list[str]:
        return [tool.name for tool in (await client.list_tools()).tools]

    assert asyncio.run(_mcp(live_app.url, outsider.auth, outsider_view)) == []

    async def outsider_call(client: Client) -> str:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("alpha__add", {"a": 1, "b": 1})
        return str(raised.value)

    assert asyncio.run(_mcp(live_app.url, outsider.auth, outsider_call)) == "Unknown tool: alpha__add"


def test_mcp_endpoint_with_a_read_only_token(
    live_app: LiveServer, owner: Actor, sandbox_actor: Actor, alpha: Upstream
) -> None:
    register(owner, "alpha", alpha.url)

    async def work(client: Client) -> Any:
        return await client.call_tool("alpha__add", {"a": 1, "b": 1})

    assert asyncio.run(_mcp(live_app.url, sandbox_actor.auth, work)).structured_content == {"result": 2}


def test_legacy_mcp_clients_are_served(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)

    async def run() -> Any:
        async with create_mcp_http_client(headers=owner.auth) as http:
            transport = streamable_http_client(f"{live_app.url}/api/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                return await client.call_tool("alpha__add", {"a": 4, "b": 4})

    assert asyncio.run(run()).structured_content == {"result": 8}
