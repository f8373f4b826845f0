"""The dashboard's notion of "current organization" for a signed-in person."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest

from accounts.models import Membership, Organization, User

SESSION_ORG_KEY = "current_org_id"


@dataclass(frozen=True)
class DashboardContext:
    user: User
    organization: Organization
    membership: Membership


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
