"""Reads for the tool catalog. The visibility rule lives here, once.

A server's tools are usable by a caller when the server is enabled and either open to the whole
organization or shared with a team the caller belongs to. Owners and admins additionally see every
server of the organization in the registry (they manage them) but call tools under the same rule.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from common.principal import Principal
from toolapi.models import McpServer, McpTool, ToolCall, Visibility


def _usable_filter(principal: Principal, prefix: str = "") -> Q:
    open_to_all = Q(**{f"{prefix}visibility": Visibility.ORGANIZATION})
    via_team = Q(**{f"{prefix}teams__members": principal.user})
    return Q(**{f"{prefix}enabled": True}) & (open_to_all | via_team)


def registry_servers(*, principal: Principal) -> QuerySet[McpServer]:
    """Servers listed in the registry API and dashboard for this caller."""
    servers = McpServer.objects.filter(organization=principal.organization)
    if not principal.is_admin:
        servers = servers.filter(Q(visibility=Visibility.ORGANIZATION) | Q(teams__members=principal.user))
    # The team join can repeat a server; ids keep the result a plain, orderable queryset.
    return McpServer.objects.filter(pk__in=servers.values("pk")).prefetch_related("teams").order_by("name")


def registry_server(*, principal: Principal, server_id: str) -> McpServer | None:
    return registry_servers(principal=principal).filter(pk=server_id).first()


def usable_servers(*, principal: Principal) -> QuerySet[McpServer]:
    ids = McpServer.objects.filter(organization=principal.organization).filter(_usable_filter(principal)).values("pk")
    return McpServer.objects.filter(pk__in=ids)


def catalog_fingerprint(*, principal: Principal) -> tuple[tuple[str, str], ...]:
    """What the caller's catalog depends on: which servers, and when each last changed.

    Anything that changes the published catalog (a tool list, a server's settings, team sharing)
    bumps ``catalog_changed_at`` or changes this set, so it doubles as the cache key.
    """
    rows = usable_servers(principal=principal).order_by("pk").values_list("pk", "catalog_changed_at")
    return tuple((pk, changed.isoformat()) for pk, changed in rows)


def catalog_tools(*, principal: Principal) -> QuerySet[McpTool]:
    return (
        McpTool.objects.filter(server__in=usable_servers(principal=principal))
        .select_related("server")
        .order_by("server__name", "position", "name")
    )


def tool_for_call(*, principal: Principal, name: str) -> McpTool | None:
    """The tool the caller may call under ``name``, or None (unknown and forbidden look the same)."""
    return (
        McpTool.objects.filter(organization=principal.organization, name=name)
        .filter(server__in=usable_servers(principal=principal))
        .select_related("server")
        .first()
    )


def server_tools(*, server: McpServer) -> QuerySet[McpTool]:
    return McpTool.objects.filter(server=server).order_by("position", "name")


def recent_calls(*, principal: Principal) -> QuerySet[ToolCall]:
    calls = ToolCall.objects.filter(organization=principal.organization).select_related("user")
    if not principal.is_admin:
        calls = calls.filter(user=principal.user)
    return calls.order_by("-created_at")
