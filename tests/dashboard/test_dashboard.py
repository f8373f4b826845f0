from __future__ import annotations

import re

import pytest
from django.test import Client

from accounts.models import ApiToken
from tests.conftest import Actor

pytestmark = pytest.mark.django_db


def test_pages_need_login(anon: Client) -> None:
    response = anon.get("/tokens/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_sign_in_with_token_then_create_and_revoke(owner: Actor) -> None:
    browser = Client()
    response = browser.post("/login/", {"token": owner.token})
    assert response.status_code == 302
    home = browser.get("/")
    assert home.status_code == 200
    assert b"acme" in home.content

    page = browser.post("/tokens/", {"name": "laptop"})
    assert page.status_code == 200
    shown = re.search(rb'id="new-token">(svc_pat_[^<]+)<', page.content)
    assert shown, "the new token is shown once"
    raw = shown.group(1).decode()
    assert Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/v1/me").status_code == 200
    # Listing again never shows the secret.
    assert raw.encode() not in browser.get("/tokens/").content

    token = ApiToken.objects.get(name="laptop")
    assert browser.post(f"/tokens/{token.pk}/revoke/").status_code == 302
    assert Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/v1/me").status_code == 401


def test_sign_in_with_password(owner: Actor) -> None:
    owner.user.set_password("correct horse battery")
    owner.user.save()
    browser = Client()
    assert browser.post("/login/", {"email": "OWNER@acme.test", "password": "wrong"}).status_code == 200
    assert browser.post("/login/", {"email": "OWNER@acme.test", "password": "correct horse battery"}).status_code == 302
    assert browser.get("/").status_code == 200


def test_bad_token_does_not_sign_in() -> None:
    browser = Client()
    response = browser.post("/login/", {"token": "svc_pat_nope"})
    assert response.status_code == 200
    assert b"not valid" in response.content
    assert browser.get("/").status_code == 302


def test_cannot_revoke_someone_elses_token_from_dashboard(owner: Actor, outsider: Actor) -> None:
    browser = Client()
    browser.post("/login/", {"token": outsider.token})
    victim = ApiToken.objects.get(user=owner.user)
    browser.post(f"/tokens/{victim.pk}/revoke/")
    victim.refresh_from_db()
    assert victim.revoked_at is None


def test_api_docs_render_for_a_signed_in_person(owner: Actor) -> None:
    browser = Client()
    browser.post("/login/", {"token": owner.token})
    docs = browser.get("/api/docs")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()
    schema = browser.get("/api/v1/schema")
    assert schema.status_code == 200
    assert b"/api/v1/me" in schema.content
