"""Shared fixtures: an organization with an owner, a teammate and an admin, and an outsider organization.

Every app's tests build on these so that "another organization's id answers 404" is checked the same
way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from accounts import services
from accounts.models import Membership, Organization, Role, Team, User


@dataclass
class Actor:
    """A person acting through the API with their own bearer token."""

    user: User
    organization: Organization
    membership: Membership
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}

    @property
    def auth(self) -> dict[str, str]:
        """The same header as a plain mapping, for httpx/requests clients against a live server."""
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> Client:
        return Client(headers={"Authorization": f"Bearer {self.token}"})


def make_actor(org_slug: str, email: str, role: str = Role.MEMBER, *, read_only: bool = False) -> Actor:
    membership = services.ensure_member(org_slug=org_slug, email=email, role=role)
    issued = services.create_token(
        user=membership.user, organization=membership.organization, name="test", read_only=read_only
    )
    return Actor(user=membership.user, organization=membership.organization, membership=membership, token=issued.raw)


@pytest.fixture
def owner(db: Any) -> Actor:
    return make_actor("acme", "owner@acme.test", Role.OWNER)


@pytest.fixture
def admin_actor(owner: Actor) -> Actor:
    return make_actor("acme", "admin@acme.test", Role.ADMIN)


@pytest.fixture
def teammate(owner: Actor) -> Actor:
    return make_actor("acme", "mate@acme.test", Role.MEMBER)


@pytest.fixture
def outsider(db: Any) -> Actor:
    return make_actor("globex", "someone@globex.test", Role.OWNER)


@pytest.fixture
def team(owner: Actor, teammate: Actor) -> Team:
    return services.create_team(organization=owner.organization, name="Platform", members=[teammate.user])


@pytest.fixture
def anon() -> Client:
    return Client()


@pytest.fixture
def live(transactional_db: Any) -> Any:
    """A uvicorn process (as `make run` serves the app) on a free loopback port (see tests/live.py)."""
    from tests.live import live_server_fixture

    yield from live_server_fixture()
