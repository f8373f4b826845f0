"""Dashboard pages: the organization's MCP servers, their health and tools, and recent calls."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts.models import Role
from common.principal import Principal
from dashboard.context import DashboardContext, current_context
from toolapi import selectors, services


def _principal(ctx: DashboardContext) -> Principal:
    return Principal(user=ctx.user, organization=ctx.organization, role=ctx.membership.role, token=None)


def _context(request: HttpRequest) -> DashboardContext | HttpResponse:
    ctx = current_context(request)
    if ctx is None:
        return render(request, "dashboard/no_organization.html", status=403)
    return ctx


@login_required
def tools_page(request: HttpRequest) -> HttpResponse:
    ctx = _context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = _principal(ctx)
    servers = list(selectors.registry_servers(principal=principal))
    counts = {server.pk: server.tools.count() for server in servers}
    rows = [{"server": server, "tool_count": counts[server.pk]} for server in servers]
    calls = selectors.recent_calls(principal=principal)[:50]
    return render(
        request,
        "toolapi/tools.html",
        {"ctx": ctx, "rows": rows, "calls": calls, "is_admin": ctx.membership.role in (Role.OWNER, Role.ADMIN)},
    )


@login_required
def server_page(request: HttpRequest, server_id: str) -> HttpResponse:
    ctx = _context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    principal = _principal(ctx)
    server = selectors.registry_server(principal=principal, server_id=server_id)
    if server is None:
        raise Http404
    tools = selectors.server_tools(server=server)
    calls = selectors.recent_calls(principal=principal).filter(server=server)[:50]
    return render(request, "toolapi/server.html", {"ctx": ctx, "server": server, "tools": tools, "calls": calls})


@login_required
@require_POST
def refresh_server(request: HttpRequest, server_id: str) -> HttpResponse:
    ctx = _context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    server = selectors.registry_server(principal=_principal(ctx), server_id=server_id)
    if server is None:
        raise Http404
    outcome = services.refresh_server_tools(server=server)
    if outcome.ok:
        messages.success(request, f"{server.name}: {outcome.tool_count} tools.")
    else:
        messages.error(request, f"{server.name}: {outcome.error}")
    return redirect("dashboard-tool-server", server_id=server.pk)
