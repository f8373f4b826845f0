from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import Organization
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from tests.conftest import Actor

pytestmark = pytest.mark.django_db(transaction=True)


def _browser(actor: Actor) -> Client:
    browser = Client()
    browser.post("/login/", {"token": actor.token})
    return browser


def test_admin_enables_creates_and_destroys(owner: Actor) -> None:
    browser = _browser(owner)
    page = browser.get("/sandboxes/")
    assert page.status_code == 200 and b"Enable sandboxes" in page.content
    browser.post("/sandboxes/enable/", {"enabled": "1"})
    assert Organization.objects.get(pk=owner.organization.pk).sandboxes_enabled
    browser.post("/sandboxes/create/")
    sandbox = Sandbox.objects.get(organization=owner.organization)
    try:
        assert sandbox.status == SandboxStatus.RUNNING
        listing = browser.get("/sandboxes/")
        assert sandbox.pk.encode() in listing.content
        detail = browser.get(f"/sandboxes/{sandbox.pk}/")
        assert b"sandbox.create" in detail.content and b"memory" in detail.content
        browser.post(f"/sandboxes/{sandbox.pk}/destroy/")
        sandbox.refresh_from_db()
        assert sandbox.status == SandboxStatus.DESTROYED
        assert get_runtime().inspect(sandbox.pk) is None
    finally:
        get_runtime().destroy(sandbox.pk)


def test_members_cannot_enable_and_outsiders_see_nothing(owner: Actor, teammate: Actor, outsider: Actor) -> None:
    _browser(teammate).post("/sandboxes/enable/", {"enabled": "1"})
    assert not Organization.objects.get(pk=owner.organization.pk).sandboxes_enabled
    sandbox = Sandbox.objects.create(
        organization=owner.organization,
        runtime="local",
        last_activity_at="2026-01-01T00:00Z",
        status=SandboxStatus.DESTROYED,
    )
    assert _browser(outsider).get(f"/sandboxes/{sandbox.pk}/").status_code == 404
    assert _browser(outsider).post(f"/sandboxes/{sandbox.pk}/destroy/").status_code == 404
