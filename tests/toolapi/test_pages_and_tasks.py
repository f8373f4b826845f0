"""Dashboard pages, admin, and the scheduled discovery."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import User
from tests.conftest import Actor
from tests.toolapi.conftest import register
from tests.toolapi.upstreams import Upstream
from toolapi import tasks
from toolapi.models import Health, McpServer, McpTool

pytestmark = pytest.mark.django_db


def test_dashboard_lists_servers_tools_and_calls(owner: Actor, outsider: Actor, alpha: Upstream) -> None:
    server = register(owner, "alpha", alpha.url, headers={"Authorization": "Bearer very-secret"})
    owner.client().post("/api/mcp-httpapi/tools/alpha__add", data={"a": "1", "b": "2"})
    client = Client()
    client.force_login(owner.user)
    page = client.get("/tools/")
    assert page.status_code == 200
    assert b"alpha" in page.content and b"alpha__add" in page.content
    detail = client.get(f"/tools/servers/{server['id']}/")
    assert detail.status_code == 200
    assert b"alpha__pick_color" in detail.content and b"Authorization" in detail.content
    assert b"very-secret" not in detail.content
    refreshed = client.post(f"/tools/servers/{server['id']}/refresh/")
    assert refreshed.status_code == 302
    stranger = Client()
    stranger.force_login(outsider.user)
    assert stranger.get(f"/tools/servers/{server['id']}/").status_code == 404


def test_admin_pages_load(owner: Actor, alpha: Upstream) -> None:
    server = register(owner, "alpha", alpha.url, headers={"Authorization": "Bearer very-secret"})
    owner.client().post("/api/mcp-httpapi/tools/alpha__add", data={"a": "1", "b": "2"})
    staff = User.objects.create_superuser("root@acme.test", "pw-123456")
    client = Client()
    client.force_login(staff)
    for path in (
        "/admin/toolapi/mcpserver/",
        f"/admin/toolapi/mcpserver/{server['id']}/change/",
        "/admin/toolapi/toolcall/",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        assert b"very-secret" not in response.content


def test_scheduled_refresh_survives_a_broken_upstream(owner: Actor, alpha: Upstream) -> None:
    good = register(owner, "alpha", alpha.url)
    bad = register(owner, "down", "http://127.0.0.1:9/mcp")
    McpTool.objects.filter(server_id=good["id"]).delete()
    outcome = tasks.refresh_all_tool_catalogs()
    assert outcome == {good["id"]: True, bad["id"]: False}
    assert McpServer.objects.get(pk=good["id"]).health == Health.OK
    assert McpServer.objects.get(pk=bad["id"]).health == Health.ERROR
    assert McpTool.objects.filter(server_id=good["id"]).count() > 5
    assert tasks.refresh_server_tools(good["id"]) is True
