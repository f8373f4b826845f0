from __future__ import annotations

import pytest

from accounts.models import Organization, Team
from tests.conftest import Actor

pytestmark = pytest.mark.django_db


def test_me_lists_teams(teammate: Actor, team: Team) -> None:
    body = teammate.client().get("/api/v1/me").json()
    assert [t["id"] for t in body["teams"]] == [team.pk]
    assert body["teams"][0]["memberIds"] == [teammate.user.pk]


def test_teams_are_scoped_to_the_organization(owner: Actor, team: Team, outsider: Actor) -> None:
    assert [t["name"] for t in owner.client().get("/api/v1/teams").json()["results"]] == ["Platform"]
    assert outsider.client().get("/api/v1/teams").json()["results"] == []


@pytest.mark.parametrize("who", ["owner", "admin_actor"])
def test_owner_and_admin_can_patch_organization(who: str, request: pytest.FixtureRequest) -> None:
    actor: Actor = request.getfixturevalue(who)
    response = actor.client().patch(
        "/api/v1/organization", {"sandboxesEnabled": True, "name": "Acme Inc"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["sandboxesEnabled"] is True
    assert Organization.objects.get(slug="acme").name == "Acme Inc"


def test_member_cannot_patch_organization(teammate: Actor) -> None:
    response = teammate.client().patch(
        "/api/v1/organization", {"sandboxesEnabled": True}, content_type="application/json"
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert Organization.objects.get(slug="acme").sandboxes_enabled is False
    assert teammate.client().get("/api/v1/organization").status_code == 200


def test_patch_validation_errors_name_the_field(owner: Actor) -> None:
    response = owner.client().patch(
        "/api/v1/organization", {"sandboxesEnabled": "perhaps", "colour": 1}, content_type="application/json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert "sandboxesEnabled" in error["details"]["fields"]


def test_outsider_patch_changes_only_its_own_organization(owner: Actor, outsider: Actor) -> None:
    outsider.client().patch("/api/v1/organization", {"name": "Taken"}, content_type="application/json")
    assert Organization.objects.get(slug="acme").name != "Taken"
    assert Organization.objects.get(slug="globex").name == "Taken"
