"""The dashboard's notion of "current organization" for a signed-in person."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.models import Membership, Organization, User
from accounts.selectors import organizations_of
from common.principal import Principal

SESSION_ORG_KEY = "current_org_id"


@dataclass(frozen=True)
class DashboardContext:
    user: User
    organization: Organization
    membership: Membership

    @property
    def principal(self) -> Principal:
        """The signed-in person as the API's selectors and services see a caller (full rights, no token)."""
        return Principal(user=self.user, organization=self.organization, role=self.membership.role, token=None)


def current_context(request: HttpRequest) -> DashboardContext | None:
    user = request.user
    if not isinstance(user, User):
        return None
    memberships = Membership.objects.filter(user=user).select_related("organization").order_by("organization__name")
    wanted = request.session.get(SESSION_ORG_KEY)
    membership = next((m for m in memberships if m.organization_id == wanted), None) or memberships.first()
    if membership is None:
        return None
    return DashboardContext(user=user, organization=membership.organization, membership=membership)


def require_context(request: HttpRequest) -> DashboardContext | HttpResponse:
    """The context, or the "no organization" page for a signed-in person who belongs to none."""
    ctx = current_context(request)
    if ctx is None:
        return render(request, "dashboard/no_organization.html", status=403)
    return ctx


def render_page(request: HttpRequest, template: str, ctx: DashboardContext, **extra: Any) -> HttpResponse:
    """Render a dashboard page with what base.html needs (organization switcher)."""
    return render(request, template, {"ctx": ctx, "organizations": organizations_of(user=ctx.user), **extra})
