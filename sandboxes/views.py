"""Dashboard pages for sandboxes: list, create, destroy, the organization's opt-in switch, audit log."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.services import update_organization
from audit import selectors as audit_selectors
from audit.services import client_address
from common.errors import ApiError
from dashboard.context import DashboardContext, render_page, require_context
from sandboxes import selectors, services
from sandboxes.models import DestroyReason, Sandbox


def _sandbox_or_404(ctx: DashboardContext, sandbox_id: str) -> Sandbox:
    try:
        return selectors.get_sandbox(principal=ctx.principal, sandbox_id=sandbox_id)
    except ApiError:
        raise Http404("Sandbox not found") from None


@login_required
def sandboxes_page(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    sandboxes = selectors.organization_sandboxes(principal=ctx.principal, status="active")
    recent = selectors.organization_sandboxes(principal=ctx.principal, status="destroyed")[:20]
    return render_page(request, "sandboxes/list.html", ctx, sandboxes=sandboxes, recent=recent)


@login_required
@require_POST
def create(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    try:
        sandbox = services.create_sandbox(principal=ctx.principal, address=client_address(request))
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Sandbox {sandbox.pk} is running.")
    return redirect("dashboard-sandboxes")


@login_required
@require_POST
def destroy(request: HttpRequest, sandbox_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    sandbox = _sandbox_or_404(ctx, sandbox_id)
    if services.destroy_sandbox(
        sandbox=sandbox, reason=DestroyReason.USER, principal=ctx.principal, address=client_address(request)
    ):
        messages.success(request, f"Sandbox {sandbox.pk} destroyed.")
    return redirect("dashboard-sandboxes")


@login_required
@require_POST
def toggle(request: HttpRequest) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    if not ctx.principal.is_admin:
        messages.error(request, "Only owners and admins can change this.")
    else:
        update_organization(organization=ctx.organization, sandboxes_enabled=request.POST.get("enabled") == "1")
    return redirect("dashboard-sandboxes")


@login_required
def detail(request: HttpRequest, sandbox_id: str) -> HttpResponse:
    ctx = require_context(request)
    if isinstance(ctx, HttpResponse):
        return ctx
    sandbox = _sandbox_or_404(ctx, sandbox_id)
    events = audit_selectors.sandbox_events(organization=ctx.organization, sandbox_id=sandbox.pk)[:200]
    return render_page(request, "sandboxes/detail.html", ctx, sandbox=sandbox, events=events)
