"""The MCP server registry: CRUD, encrypted headers, visibility, discovery and permissions."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import Team
from common import crypto
from tests.conftest import Actor, make_actor
from tests.toolapi.conftest import register
from tests.toolapi.upstreams import Upstream
from toolapi.models import Health, McpServer, McpTool

pytestmark = pytest.mark.django_db

SECRET = "Bearer upstream-secret-123"


def test_owner_registers_a_server_and_its_tools_are_discovered(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url, headers={"Authorization": SECRET, "X-Tenant": "acme"})
    assert body["name"] == "alpha"
    assert body["health"] == "ok"
    assert body["headerNames"] == ["Authorization", "X-Tenant"]
    names = {tool["name"] for tool in body["tools"]}
    assert {"alpha__pick_color", "alpha__add", "alpha__create_order", "alpha__slow", "alpha__fail"} <= names
    assert body["toolCount"] == len(body["tools"])
    # The configured headers reach the upstream.
    assert any(h.get("authorization") == SECRET and h.get("x-tenant") == "acme" for h in alpha.seen_headers)


def test_headers_are_encrypted_at_rest_and_never_returned(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url, headers={"Authorization": SECRET})
    stored = McpServer.objects.get(pk=body["id"])
    assert SECRET not in stored.headers_encrypted
    assert crypto.decrypt_json(stored.headers_encrypted) == {"Authorization": SECRET}
    for response in (
        owner.client().get(f"/api/v1/mcp-servers/{body['id']}"),
        owner.client().get("/api/v1/mcp-servers"),
    ):
        assert response.status_code == 200
        assert SECRET.encode() not in response.content
        assert b"upstream-secret" not in response.content


def test_pagination_of_the_upstream_tool_list_is_followed(owner: Actor, beta: Upstream) -> None:
    # beta lists one tool per page.
    body = register(owner, "beta", beta.url)
    assert sorted(tool["upstreamName"] for tool in body["tools"]) == ["add", "register", "tags.list"]
    assert "beta__tags.list" in {tool["name"] for tool in body["tools"]}


def test_unreachable_upstream_is_registered_with_its_error(owner: Actor) -> None:
    body = register(owner, "down", "http://127.0.0.1:9/mcp")
    assert body["health"] == "error"
    assert body["lastError"]
    assert body["tools"] == []


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"name": "Bad Name", "url": "http://127.0.0.1:1/mcp"}, "name"),
        ({"name": "a__b", "url": "http://127.0.0.1:1/mcp"}, "name"),
        ({"name": "ok", "url": "ftp://example.com/"}, "url"),
        ({"name": "ok", "url": "http://127.0.0.1:1/mcp", "headers": {"Host": "x"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:1/mcp", "headers": {"X": "a\nb"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:1/mcp", "visibility": "world"}, "visibility"),
        ({"name": "ok", "url": "http://127.0.0.1:1/mcp", "surprise": 1}, "surprise"),
    ],
)
def test_invalid_registrations_are_rejected(owner: Actor, payload: dict[str, Any], field: str) -> None:
    response = owner.client().post("/api/v1/mcp-servers", data=payload, content_type="application/json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]["fields"]
    assert not McpServer.objects.exists()


def test_duplicate_name_is_a_conflict(owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    response = owner.client().post(
        "/api/v1/mcp-servers", data={"name": "alpha", "url": alpha.url}, content_type="application/json"
    )
    assert response.status_code == 409


def test_members_cannot_register_and_read_only_tokens_cannot_write(
    owner: Actor, teammate: Actor, sandbox_actor: Actor, alpha: Upstream
) -> None:
    body = register(owner, "alpha", alpha.url)
    response = teammate.client().post(
        "/api/v1/mcp-servers", data={"name": "mine", "url": alpha.url}, content_type="application/json"
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"

    listed = sandbox_actor.client().get("/api/v1/mcp-servers")
    assert listed.status_code == 200
    assert [s["id"] for s in listed.json()["results"]] == [body["id"]]
    for method, path in [
        ("post", "/api/v1/mcp-servers"),
        ("put", f"/api/v1/mcp-servers/{body['id']}"),
        ("patch", f"/api/v1/mcp-servers/{body['id']}"),
        ("delete", f"/api/v1/mcp-servers/{body['id']}"),
    ]:
        response = getattr(sandbox_actor.client(), method)(
            path, data={"name": "x", "url": alpha.url}, content_type="application/json"
        )
        assert response.status_code == 403, (method, path)
        assert response.json()["error"]["code"] == "read_only_token"
    assert McpServer.objects.get(pk=body["id"]).name == "alpha"


def test_another_organizations_server_is_not_found(owner: Actor, outsider: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url)
    client = outsider.client()
    assert client.get(f"/api/v1/mcp-servers/{body['id']}").status_code == 404
    assert client.delete(f"/api/v1/mcp-servers/{body['id']}").status_code == 404
    assert client.post(f"/api/v1/mcp-servers/{body['id']}/refresh").status_code == 404
    assert client.get("/api/v1/mcp-servers").json()["results"] == []
    assert McpServer.objects.filter(pk=body["id"]).exists()


def test_team_visibility(owner: Actor, teammate: Actor, team: Team, alpha: Upstream) -> None:
    other = make_actor("acme", "other@acme.test")
    body = register(owner, "alpha", alpha.url, visibility="teams", teamIds=[team.pk])
    assert body["teamIds"] == [team.pk]
    assert [s["id"] for s in teammate.client().get("/api/v1/mcp-servers").json()["results"]] == [body["id"]]
    assert other.client().get("/api/v1/mcp-servers").json()["results"] == []
    assert other.client().get(f"/api/v1/mcp-servers/{body['id']}").status_code == 404


def test_unknown_team_is_rejected(owner: Actor, outsider: Actor, alpha: Upstream) -> None:
    from accounts import services as account_services

    foreign = account_services.create_team(organization=outsider.organization, name="Foreign", members=[])
    response = owner.client().post(
        "/api/v1/mcp-servers",
        data={"name": "alpha", "url": alpha.url, "visibility": "teams", "teamIds": [foreign.pk]},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "teamIds" in response.json()["error"]["details"]["fields"]


def test_update_renames_tools_and_replaces_headers(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url, headers={"Authorization": SECRET})
    response = owner.client().patch(
        f"/api/v1/mcp-servers/{body['id']}",
        data={"name": "renamed", "headers": {"X-New": "1"}},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    updated = response.json()
    assert updated["headerNames"] == ["X-New"]
    assert all(tool["name"].startswith("renamed__") for tool in updated["tools"])
    assert not McpTool.objects.filter(name__startswith="alpha__").exists()
    assert McpServer.objects.get(pk=body["id"]).headers == {"X-New": "1"}


def test_delete_removes_server_and_tools(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url)
    assert owner.client().delete(f"/api/v1/mcp-servers/{body['id']}").status_code == 204
    assert not McpServer.objects.exists()
    assert not McpTool.objects.exists()


def test_refresh_records_health(owner: Actor, alpha: Upstream) -> None:
    body = register(owner, "alpha", alpha.url)
    McpServer.objects.filter(pk=body["id"]).update(health=Health.UNKNOWN)
    response = owner.client().post(f"/api/v1/mcp-servers/{body['id']}/refresh")
    assert response.status_code == 200
    assert response.json()["health"] == "ok"
    assert response.json()["lastCheckedAt"]
