"""The tool lookup cache calls go through, and the batched audit writer of the fast path."""

from __future__ import annotations

import time
from typing import Any

import pytest

from accounts.models import Team
from common.auth import principal_from_raw_token
from tests.conftest import Actor
from tests.toolapi.conftest import register
from tests.toolapi.upstreams import Upstream
from toolapi import catalog, services
from toolapi.models import CallChannel, CallStatus, McpServer, McpTool, ToolCall
from toolapi.recording import CallRecorder


def test_the_documented_bound() -> None:
    assert catalog.DEFAULT_TOOL_CACHE_SECONDS == 2.0


@pytest.mark.django_db
def test_a_lookup_is_served_without_queries(owner: Actor, alpha: Upstream, django_assert_num_queries: Any) -> None:
    register(owner, "alpha", alpha.url)
    principal = principal_from_raw_token(owner.token)
    assert catalog.cached_tool(principal=principal, name="alpha__add") is None
    found = catalog.tool_for_call(principal=principal, name="alpha__add")
    assert found is not None
    assert (found.tool.name, found.target.url) == ("alpha__add", alpha.url)
    with django_assert_num_queries(0):
        assert catalog.tool_for_call(principal=principal, name="alpha__add") is found


@pytest.mark.django_db
def test_unknown_names_are_not_cached(owner: Actor) -> None:
    principal = principal_from_raw_token(owner.token)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is None
    assert catalog.cached_tool(principal=principal, name="alpha__add") is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda server, team: services.update_server(server=server, enabled=False), id="disabled"),
        pytest.param(
            lambda server, team: services.update_server(server=server, visibility="teams", team_ids=[team.pk]),
            id="restricted to a team",
        ),
        pytest.param(
            lambda server, team: services.update_server(server=server, url="http://127.0.0.1:9/mcp"), id="url"
        ),
        pytest.param(lambda server, team: services.delete_server(server=server), id="deleted"),
    ],
)
def test_changes_through_the_services_drop_cached_lookups(
    owner: Actor, alpha: Upstream, team: Team, change: Any
) -> None:
    body = register(owner, "alpha", alpha.url)
    principal = principal_from_raw_token(owner.token)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is not None
    change(McpServer.objects.get(pk=body["id"]), team)
    assert catalog.cached_tool(principal=principal, name="alpha__add") is None


@pytest.mark.django_db
def test_rediscovered_tools_drop_cached_lookups(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url)
    principal = principal_from_raw_token(owner.token)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is not None
    McpTool.objects.filter(server_id=body["id"], name="alpha__add").delete()
    services.refresh_server_tools(server=McpServer.objects.get(pk=body["id"]))  # finds it again: a change
    assert catalog.cached_tool(principal=principal, name="alpha__add") is None


@pytest.mark.django_db
def test_changes_made_elsewhere_take_effect_within_the_bound(owner: Actor, alpha: Upstream, settings: Any) -> None:
    settings.TOOL_CACHE_SECONDS = 0.3
    body = register(owner, "alpha", alpha.url)
    principal = principal_from_raw_token(owner.token)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is not None
    # Disabled by another process: this one keeps the lookup for at most the bound.
    McpServer.objects.filter(pk=body["id"]).update(enabled=False)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is not None
    time.sleep(0.35)
    assert catalog.tool_for_call(principal=principal, name="alpha__add") is None


def _record(actor: Actor, tool: McpTool, status: CallStatus) -> dict[str, Any]:
    return {
        "principal": principal_from_raw_token(actor.token),
        "tool": tool,
        "channel": CallChannel.HTTP,
        "status": status,
        "is_error": status != CallStatus.OK,
        "duration_ms": 1.5,
        "request_bytes": 10,
        "response_bytes": 20,
    }


@pytest.mark.django_db(transaction=True)
def test_the_recorder_stores_every_submitted_call(owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    tool = McpTool.objects.select_related("server").get(name="alpha__add")
    recorder = CallRecorder()
    statuses = [CallStatus.OK, CallStatus.TOOL_ERROR, CallStatus.UNREACHABLE] * 5
    for status in statuses:
        recorder.submit(_record(owner, tool, status))
    assert recorder.flush()
    stored = list(ToolCall.objects.order_by("created_at"))
    assert sorted(call.status for call in stored) == sorted(statuses)
    first = stored[0]
    assert (first.tool_name, first.server_name, first.user_id) == ("alpha__add", "alpha", owner.user.pk)
    assert (first.duration_ms, first.request_bytes, first.response_bytes) == (1.5, 10, 20)
    assert owner.token.startswith(first.token_prefix)
