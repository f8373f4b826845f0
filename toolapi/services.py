"""Writes for the tool catalog: the server registry, tool discovery and the call audit."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization, Team, User
from common.errors import ApiError
from common.principal import Principal
from toolapi import catalog
from toolapi.models import TOOL_SEPARATOR, CallChannel, CallStatus, Health, McpServer, McpTool, ToolCall, Visibility
from toolapi.upstream import UpstreamError, UpstreamTarget, hub

logger = logging.getLogger(__name__)

# What a tool name may carry to be a URL path segment and an operationId without escaping.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_TOOL_PART = 150


def exposed_tool_name(server_name: str, upstream_name: str) -> str:
    part = _UNSAFE.sub("_", upstream_name) or "_"
    # Names made only of unsafe characters would all become underscores: a digest keeps them apart.
    if len(part) > MAX_TOOL_PART or (part != upstream_name and not part.strip("_")):
        digest = hashlib.sha256(upstream_name.encode()).hexdigest()[:8]
        part = f"{part[: MAX_TOOL_PART - 9]}_{digest}"
    return f"{server_name}{TOOL_SEPARATOR}{part}"


def target_for(server: McpServer) -> UpstreamTarget:
    return UpstreamTarget(
        server_id=server.pk,
        url=server.url,
        headers=tuple(sorted(server.headers.items())),
        timeout=server.timeout_seconds,
    )


def _catalog_changed() -> None:
    # Cached tool lookups of this process: dropped now, and again once the change is committed, so a
    # lookup that read the old rows in between cannot keep serving them.
    catalog.forget_tools()
    transaction.on_commit(catalog.forget_tools)


def _set_teams(server: McpServer, team_ids: Iterable[str]) -> None:
    wanted = set(team_ids)
    teams = list(Team.objects.filter(organization_id=server.organization_id, pk__in=wanted))
    missing = wanted - {team.pk for team in teams}
    if missing:
        raise ApiError(
            status_code=400,
            code="validation_error",
            message="Request is invalid.",
            details={"fields": {"teamIds": [f"Unknown team: {team_id}" for team_id in sorted(missing)]}},
        )
    server.teams.set(teams)


def _name_taken(organization: Organization, name: str, exclude: str | None = None) -> None:
    taken = McpServer.objects.filter(organization=organization, name=name)
    if exclude:
        taken = taken.exclude(pk=exclude)
    if taken.exists():
        raise ApiError(
            status_code=409, code="conflict", message=f"A server named {name!r} already exists in this organization."
        )


@transaction.atomic
def create_server(
    *,
    organization: Organization,
    created_by: User | None,
    name: str,
    url: str,
    headers: dict[str, str] | None = None,
    description: str = "",
    enabled: bool = True,
    visibility: str = Visibility.ORGANIZATION,
    team_ids: Iterable[str] = (),
    timeout_seconds: float = 300.0,
) -> McpServer:
    _name_taken(organization, name)
    server = McpServer(
        organization=organization,
        created_by=created_by,
        name=name,
        url=url,
        description=description,
        enabled=enabled,
        visibility=visibility,
        timeout_seconds=timeout_seconds,
    )
    server.set_headers(headers or {})
    server.save()
    _set_teams(server, team_ids)
    return server


_UNSET: Any = object()


@transaction.atomic
def update_server(
    *,
    server: McpServer,
    name: str = _UNSET,
    url: str = _UNSET,
    headers: dict[str, str] | None = _UNSET,
    description: str = _UNSET,
    enabled: bool = _UNSET,
    visibility: str = _UNSET,
    team_ids: Iterable[str] = _UNSET,
    timeout_seconds: float = _UNSET,
) -> tuple[McpServer, bool]:
    """Apply the given changes; returns the server and whether its tools must be rediscovered."""
    rediscover = False
    if name is not _UNSET and name != server.name:
        _name_taken(server.organization, name, exclude=server.pk)
        server.name = name
        # Exposed tool names carry the server name.
        for tool in McpTool.objects.filter(server=server):
            tool.name = exposed_tool_name(name, tool.upstream_name)
            tool.save(update_fields=["name"])
    if url is not _UNSET and url != server.url:
        server.url = url
        rediscover = True
    if headers is not _UNSET:
        server.set_headers(headers or {})
        rediscover = True
    if description is not _UNSET:
        server.description = description
    if enabled is not _UNSET:
        rediscover = rediscover or (enabled and not server.enabled)
        server.enabled = enabled
    if visibility is not _UNSET:
        server.visibility = visibility
    if timeout_seconds is not _UNSET:
        server.timeout_seconds = timeout_seconds
    server.catalog_changed_at = timezone.now()
    server.save()
    if team_ids is not _UNSET:
        _set_teams(server, team_ids)
    server_id = server.pk
    _catalog_changed()
    transaction.on_commit(lambda: hub.close_server(server_id))
    return server, rediscover


@transaction.atomic
def delete_server(*, server: McpServer) -> None:
    server_id = server.pk
    server.delete()
    _catalog_changed()
    transaction.on_commit(lambda: hub.close_server(server_id))


@dataclass(frozen=True)
class RefreshResult:
    ok: bool
    changed: bool
    tool_count: int
    error: str = ""


def _tool_rows(server: McpServer, tools: list[types.Tool]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    used: set[str] = set()
    for position, tool in enumerate(tools):
        name = exposed_tool_name(server.name, tool.name)
        base, counter = name, 2
        while name in used:  # two upstream names that sanitize alike
            name = f"{base}_{counter}"
            counter += 1
        used.add(name)
        rows.append(
            {
                "name": name,
                "upstream_name": tool.name,
                "title": (tool.title or (tool.annotations.title if tool.annotations else None) or "")[:500],
                "description": tool.description or "",
                "input_schema": tool.input_schema or {"type": "object"},
                "output_schema": tool.output_schema,
                "annotations": tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
                if tool.annotations
                else None,
                "position": position,
            }
        )
    return rows


_COMPARED = ("upstream_name", "title", "description", "input_schema", "output_schema", "annotations", "position")


@transaction.atomic
def _store_tools(server: McpServer, rows: list[dict[str, Any]]) -> bool:
    existing = {tool.name: tool for tool in McpTool.objects.select_for_update().filter(server=server)}
    changed = False
    for row in rows:
        tool = existing.pop(row["name"], None)
        if tool is None:
            McpTool.objects.create(organization_id=server.organization_id, server=server, **row)
            changed = True
        elif any(getattr(tool, key) != row[key] for key in _COMPARED):
            for key in _COMPARED:
                setattr(tool, key, row[key])
            tool.save()
            changed = True
    if existing:
        McpTool.objects.filter(pk__in=[tool.pk for tool in existing.values()]).delete()
        changed = True
    now = timezone.now()
    fields: dict[str, Any] = {"health": Health.OK, "last_error": "", "last_checked_at": now}
    if changed:
        fields["catalog_changed_at"] = now
        _catalog_changed()
    McpServer.objects.filter(pk=server.pk).update(**fields)
    return changed


def refresh_server_tools(*, server: McpServer) -> RefreshResult:
    """Discover the server's tools and store them; record its health either way.

    On failure the previously discovered tools are kept: a blip upstream should not make tools vanish
    from every client's OpenAPI document (calls to them answer 502 meanwhile).
    """
    try:
        tools = hub.list_tools_sync(target_for(server))
    except UpstreamError as exc:
        McpServer.objects.filter(pk=server.pk).update(
            health=Health.ERROR, last_error=str(exc)[:2000], last_checked_at=timezone.now()
        )
        server.refresh_from_db()
        return RefreshResult(ok=False, changed=False, tool_count=server.tools.count(), error=str(exc))
    rows = _tool_rows(server, tools)
    changed = _store_tools(server, rows)
    server.refresh_from_db()
    return RefreshResult(ok=True, changed=changed, tool_count=len(rows))


def refresh_server_by_id(server_id: str) -> RefreshResult | None:
    server = McpServer.objects.filter(pk=server_id, enabled=True).first()
    if server is None:
        return None
    return refresh_server_tools(server=server)


def refresh_all_servers() -> dict[str, bool]:
    """Rediscover every enabled server; one failing upstream does not stop the others."""
    outcome: dict[str, bool] = {}
    for server in McpServer.objects.filter(enabled=True).order_by("pk"):
        try:
            outcome[server.pk] = refresh_server_tools(server=server).ok
        except Exception:
            logger.exception("refreshing tools of %s failed", server.pk)
            outcome[server.pk] = False
    return outcome


def record_call(
    *,
    principal: Principal,
    tool: McpTool,
    channel: CallChannel,
    status: CallStatus,
    is_error: bool,
    duration_ms: float,
    request_bytes: int,
    response_bytes: int,
) -> ToolCall:
    call = new_call_record(
        principal=principal,
        tool=tool,
        channel=channel,
        status=status,
        is_error=is_error,
        duration_ms=duration_ms,
        request_bytes=request_bytes,
        response_bytes=response_bytes,
    )
    call.save(force_insert=True)
    return call


def record_calls(calls: list[dict[str, Any]]) -> None:
    """record_call for many calls (each a dict of its keyword arguments) in one statement."""
    ToolCall.objects.bulk_create([new_call_record(**call) for call in calls])


def new_call_record(
    *,
    principal: Principal,
    tool: McpTool,
    channel: CallChannel,
    status: CallStatus,
    is_error: bool,
    duration_ms: float,
    request_bytes: int,
    response_bytes: int,
) -> ToolCall:
    """The audit record of one call, not yet saved."""
    return ToolCall(
        organization=principal.organization,
        server_id=tool.server_id,
        server_name=tool.server.name,
        tool_name=tool.name,
        user=principal.user,
        token_prefix=principal.token_prefix,
        channel=channel,
        status=status,
        is_error=is_error,
        duration_ms=round(duration_ms, 3),
        request_bytes=request_bytes,
        response_bytes=response_bytes,
    )


def _refresh_on_notice(server_id: str) -> None:
    # Called from a short-lived thread when an upstream announces that its tool list changed.
    from django.db import connections

    try:
        refresh_server_by_id(server_id)
    except Exception:
        logger.exception("refreshing %s after a list-changed notice failed", server_id)
    finally:
        connections.close_all()


hub.on_list_changed = _refresh_on_notice
