"""The sandbox admin: operators see sandboxes (never their daemon secret) and can destroy them."""

from __future__ import annotations

import httpx
import pytest
from django.test import Client

from accounts.models import User
from audit.models import AuditEvent, EventType
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime

pytestmark = pytest.mark.django_db(transaction=True)


def test_admin_lists_and_destroys_a_running_sandbox(api: httpx.Client, sandbox_id: str) -> None:
    staff = User.objects.create_superuser("root@acme.test", "pw-123456")
    client = Client()
    client.force_login(staff)
    sandbox = Sandbox.objects.get(pk=sandbox_id)

    listing = client.get("/admin/sandboxes/sandbox/", {"q": sandbox_id})
    assert listing.status_code == 200 and sandbox_id.encode() in listing.content
    detail = client.get(f"/admin/sandboxes/sandbox/{sandbox_id}/change/")
    assert detail.status_code == 200
    assert sandbox.daemon_secret_encrypted.encode() not in detail.content

    response = client.post(
        "/admin/sandboxes/sandbox/", {"action": "destroy_selected", "_selected_action": [sandbox_id]}, follow=True
    )
    assert response.status_code == 200
    sandbox.refresh_from_db()
    assert sandbox.status == SandboxStatus.DESTROYED and sandbox.destroy_reason == "user"
    assert get_runtime().inspect(sandbox_id) is None
    event = AuditEvent.objects.get(sandbox_id=sandbox_id, event_type=EventType.SANDBOX_DESTROY)
    assert event.data["detail"] == "destroyed from the admin by root@acme.test"
    assert api.post(f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": "true"}).status_code == 410
