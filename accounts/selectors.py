"""Reads for identities, with the organization scope applied in one place."""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.models import ApiToken, Membership, Organization, Team, User


def membership_for(*, user: User, organization: Organization) -> Membership | None:
    return Membership.objects.filter(user=user, organization=organization).first()


def teams_of_user(*, user: User, organization: Organization) -> QuerySet[Team]:
    return Team.objects.filter(organization=organization, members=user).order_by("name")


def organization_teams(*, organization: Organization) -> QuerySet[Team]:
    return Team.objects.filter(organization=organization).prefetch_related("members").order_by("name")


def user_tokens(*, user: User, organization: Organization) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user, organization=organization, read_only=False).order_by("-created_at")


def organizations_of(*, user: User) -> QuerySet[Organization]:
    return Organization.objects.filter(memberships__user=user).order_by("name")
