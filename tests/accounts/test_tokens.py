from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, Role
from tests.conftest import Actor

pytestmark = pytest.mark.django_db


def test_database_never_holds_the_raw_token(owner: Actor) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prefix, token_hash, name FROM accounts_apitoken")
        rows = cursor.fetchall()
    assert rows
    for row in rows:
        assert all(owner.token not in str(value) for value in row)
    token = ApiToken.objects.get(user=owner.user)
    assert owner.token.startswith(token.prefix)
    assert len(token.prefix) < len(owner.token) // 2


def test_token_authenticates_and_records_last_use(owner: Actor) -> None:
    response = owner.client().get("/api/v1/me")
    assert response.status_code == 200
    body = response.json()
    assert body["user"]["email"] == "owner@acme.test"
    assert body["organization"]["slug"] == "acme"
    assert body["role"] == "owner"
    assert ApiToken.objects.get(user=owner.user).last_used_at is not None


def test_revoked_token_answers_401(owner: Actor) -> None:
    services.revoke_token(token=ApiToken.objects.get(user=owner.user))
    response = owner.client().get("/api/v1/me")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_expired_token_answers_401(owner: Actor) -> None:
    ApiToken.objects.filter(user=owner.user).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert owner.client().get("/api/v1/me").status_code == 401


def test_token_of_a_removed_member_answers_401(teammate: Actor) -> None:
    teammate.membership.delete()
    assert teammate.client().get("/api/v1/me").status_code == 401


def test_non_bearer_scheme_is_rejected(owner: Actor) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Token {owner.token}")
    assert client.get("/api/v1/me").status_code == 401


def test_createtoken_output_is_a_working_bearer_token() -> None:
    out = StringIO()
    call_command("createtoken", "--org", "newco", "--email", "Founder@NewCo.test", "--role", "owner", stdout=out)
    raw = out.getvalue().strip()
    assert "\n" not in raw and raw.startswith("svc_pat_")
    response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/v1/me")
    assert response.status_code == 200
    assert response.json()["organization"]["slug"] == "newco"
    assert response.json()["user"]["email"] == "founder@newco.test"
    assert response.json()["role"] == "owner"
    # Running it again reuses the organization and user, and issues a second, distinct token.
    out2 = StringIO()
    call_command("createtoken", "--org", "newco", "--email", "founder@newco.test", stdout=out2)
    assert out2.getvalue().strip() != raw
    assert ApiToken.objects.filter(organization__slug="newco").count() == 2


def test_token_api_create_shows_secret_once_and_revoke(owner: Actor) -> None:
    client = owner.client()
    created = client.post("/api/v1/tokens", {"name": "ci", "expiresInDays": 7}, content_type="application/json")
    assert created.status_code == 201
    raw = created.json()["token"]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/v1/me").status_code == 200
    listed = client.get("/api/v1/tokens").json()["results"]
    assert all("token" not in item for item in listed)
    assert {item["name"] for item in listed} == {"test", "ci"}
    assert client.delete(f"/api/v1/tokens/{created.json()['id']}").status_code == 204
    assert Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/v1/me").status_code == 401


def test_cannot_revoke_another_users_token(owner: Actor, teammate: Actor, outsider: Actor) -> None:
    mate_token = ApiToken.objects.get(user=teammate.user)
    assert owner.client().delete(f"/api/v1/tokens/{mate_token.pk}").status_code == 404
    assert outsider.client().delete(f"/api/v1/tokens/{mate_token.pk}").status_code == 404
    assert teammate.client().get("/api/v1/me").status_code == 200


def test_read_only_token_cannot_write(owner: Actor) -> None:
    issued = services.create_token(user=owner.user, organization=owner.organization, read_only=True)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
    assert client.get("/api/v1/me").json()["tokenReadOnly"] is True
    response = client.patch("/api/v1/organization", {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "read_only_token"
    response = client.post("/api/v1/tokens", {"name": "escalate"}, content_type="application/json")
    assert response.status_code == 403
    assert ApiToken.objects.filter(name="escalate").count() == 0


def test_role_validation_in_ensure_member() -> None:
    with pytest.raises(ValueError):
        services.ensure_member(org_slug="x", email="a@x.test", role="emperor")
    with pytest.raises(ValueError):
        services.ensure_member(org_slug="Not A Slug", email="a@x.test", role=Role.MEMBER)
