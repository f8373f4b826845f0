"""Tool calls over plain HTTP: JSON and form bodies, validation, errors, audit, access rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from accounts.models import Team
from tests.conftest import Actor, make_actor
from tests.toolapi.conftest import register
from tests.toolapi.upstreams import PNG_1PX, Upstream
from toolapi.models import CallChannel, CallStatus, ToolCall

pytestmark = pytest.mark.django_db


def call(actor: Actor, tool: str, arguments: Any = None, *, short: bool = False, **extra: Any) -> Any:
    path = f"/api/mcp-httpapi/{tool}" if short else f"/api/mcp-httpapi/tools/{tool}"
    body = json.dumps(arguments if arguments is not None else {})
    return actor.client().post(path, data=body, content_type="application/json", **extra)


def result_of(response: Any) -> tuple[dict[str, Any], bool]:
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"result", "isError"}
    assert isinstance(body["result"], str)
    return json.loads(body["result"]), body["isError"]


@pytest.fixture
def alpha_server(owner: Actor, alpha: Upstream) -> dict[str, Any]:
    return register(owner, "alpha", alpha.url)


def test_json_call(owner: Actor, alpha_server: dict[str, Any]) -> None:
    result, is_error = result_of(call(owner, "alpha__pick_color", {"color": "green"}))
    assert is_error is False
    # The schema's default (intensity 5) applies upstream; the text block carries the tool's output.
    assert result == {"content": [{"type": "text", "text": "green:5"}], "structuredContent": {"result": "green:5"}}


def test_structured_content_and_images_are_serialized(owner: Actor, alpha_server: dict[str, Any]) -> None:
    result, is_error = result_of(call(owner, "alpha__picture"))
    assert is_error is False
    assert result["content"] == [
        {"type": "text", "text": "a red dot"},
        {"type": "image", "data": PNG_1PX, "mimeType": "image/png"},
    ]
    assert result["structuredContent"] == {"width": 1, "height": 1}
    summed, _ = result_of(call(owner, "alpha__add", {"a": 2, "b": 3}))
    assert summed["structuredContent"] == {"result": 5}


def test_short_form_path_from_the_usage_example(owner: Actor, alpha_server: dict[str, Any]) -> None:
    result, _ = result_of(call(owner, "alpha__add", {"a": 1, "b": 1}, short=True))
    assert result["content"][0]["text"] == "2"


def test_form_encoded_values_are_coerced_by_the_schema(owner: Actor, alpha_server: dict[str, Any]) -> None:
    response = owner.client().post(
        "/api/mcp-httpapi/alpha__add", data="a=3&b=4", content_type="application/x-www-form-urlencoded"
    )
    result, _ = result_of(response)
    assert result["structuredContent"] == {"result": 7}
    response = owner.client().post(
        "/api/mcp-httpapi/tools/alpha__pick_color",
        data="color=blue&intensity=9",
        content_type="application/x-www-form-urlencoded",
    )
    assert result_of(response)[0]["content"][0]["text"] == "blue:9"
    # Multipart form data (what curl -F sends) is read the same way.
    response = owner.client().post("/api/mcp-httpapi/alpha__add", data={"a": "10", "b": "-2"})
    assert result_of(response)[0]["structuredContent"] == {"result": 8}


def test_form_value_that_does_not_fit_the_type_is_a_validation_error(
    owner: Actor, alpha_server: dict[str, Any]
) -> None:
    response = owner.client().post(
        "/api/mcp-httpapi/alpha__add", data="a=three&b=4", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"] == [
        {"path": "/a", "rule": "type", "expected": "integer", "message": "'three' is not of type 'integer'"}
    ]


@pytest.mark.parametrize(
    "tool, arguments, path, rule",
    [
        ("alpha__pick_color", {}, "", "required"),
        ("alpha__pick_color", {"color": "purple"}, "/color", "enum"),
        ("alpha__pick_color", {"color": "red", "intensity": 0}, "/intensity", "minimum"),
        ("alpha__pick_color", {"color": "red", "intensity": 11}, "/intensity", "maximum"),
        ("alpha__pick_color", {"color": "red", "intensity": "high"}, "/intensity", "type"),
        ("alpha__add", {"a": 1.5, "b": 1}, "/a", "type"),
        (
            "alpha__create_order",
            {"customer": {"name": "Ann", "address": {"street": "Main 1"}}, "items": [{"sku": "x", "quantity": 1}]},
            "/customer/address",
            "required",
        ),
        (
            "alpha__create_order",
            {
                "customer": {"name": "Ann", "address": {"street": "Main 1", "city": "Berlin"}},
                "items": [{"sku": "x", "quantity": 0}],
            },
            "/items/0/quantity",
            "minimum",
        ),
        ("alpha__draw", {"shape": {"kind": "triangle"}}, "/shape", "oneOf"),
        ("alpha__create_order", [], "", "type"),
    ],
)
def test_each_validation_error_names_path_and_rule(
    owner: Actor, alpha: Upstream, alpha_server: dict[str, Any], tool: str, arguments: Any, path: str, rule: str
) -> None:
    before = len(alpha.seen_headers)
    response = call(owner, tool, arguments)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert {"path": path, "rule": rule} in [{"path": e["path"], "rule": e["rule"]} for e in error["details"]["errors"]]
    assert error["details"]["fields"]
    # Rejected before the upstream is called.
    assert len(alpha.seen_headers) == before
    audit = ToolCall.objects.get()
    assert audit.status == CallStatus.INVALID


def test_nested_valid_call(owner: Actor, alpha_server: dict[str, Any]) -> None:
    arguments = {
        "customer": {"name": "Ann", "address": {"street": "Main 1", "city": "Berlin", "country": "FR"}},
        "items": [{"sku": "a", "quantity": 2}, {"sku": "b", "quantity": 1}],
        "note": None,
        "express": True,
    }
    result, is_error = result_of(call(owner, "alpha__create_order", arguments))
    assert not is_error
    assert result["structuredContent"] == {"customer": "Ann", "city": "Berlin", "lines": 2, "express": True}
    total, _ = result_of(call(owner, "alpha__total", {"tree": {"value": 1, "children": [{"value": 2}, {"value": 3}]}}))
    assert total["structuredContent"] == {"result": 6}
    drawn, _ = result_of(call(owner, "alpha__draw", {"shape": {"kind": "square", "side": 2}}))
    assert drawn["content"][0]["text"] == "square"


def test_malformed_json_and_wrong_media_type(owner: Actor, alpha_server: dict[str, Any]) -> None:
    response = owner.client().post("/api/mcp-httpapi/tools/alpha__add", data="{", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"
    response = owner.client().post("/api/mcp-httpapi/tools/alpha__add", data="a", content_type="text/plain")
    assert response.status_code == 415


def test_a_tool_that_raises_is_200_with_is_error(owner: Actor, alpha_server: dict[str, Any]) -> None:
    result, is_error = result_of(call(owner, "alpha__fail", {"reason": "nope"}))
    assert is_error is True
    assert result["content"][0]["type"] == "text"
    audit = ToolCall.objects.get()
    assert (audit.status, audit.is_error) == (CallStatus.TOOL_ERROR, True)


def test_unknown_tool_is_404(owner: Actor, alpha_server: dict[str, Any]) -> None:
    for name in ("alpha__nope", "nope", "beta__add"):
        response = call(owner, name, {})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_other_organization_cannot_call(owner: Actor, outsider: Actor, alpha_server: dict[str, Any]) -> None:
    response = call(outsider, "alpha__add", {"a": 1, "b": 2})
    assert response.status_code == 404
    assert not ToolCall.objects.exists()


def test_team_restricted_tools(owner: Actor, teammate: Actor, team: Team, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url, visibility="teams", teamIds=[team.pk])
    other = make_actor("acme", "other@acme.test")
    assert call(other, "alpha__add", {"a": 1, "b": 2}).status_code == 404
    assert result_of(call(teammate, "alpha__add", {"a": 1, "b": 2}))[0]["structuredContent"] == {"result": 3}


def test_disabled_server_tools_are_not_callable(owner: Actor, alpha_server: dict[str, Any]) -> None:
    owner.client().patch(
        f"/api/v1/mcp-servers/{alpha_server['id']}", data={"enabled": False}, content_type="application/json"
    )
    assert call(owner, "alpha__add", {"a": 1, "b": 2}).status_code == 404


def test_sandbox_read_only_token_calls_tools(sandbox_actor: Actor, alpha_server: dict[str, Any]) -> None:
    result, _ = result_of(call(sandbox_actor, "alpha__add", {"a": 20, "b": 22}))
    assert result["structuredContent"] == {"result": 42}
    audit = ToolCall.objects.get()
    assert audit.token_prefix == sandbox_actor.token[: len(audit.token_prefix)]


def test_calls_are_audited(owner: Actor, alpha_server: dict[str, Any]) -> None:
    response = call(owner, "alpha__add", {"a": 1, "b": 2})
    assert response.status_code == 200
    audit = ToolCall.objects.get()
    assert audit.organization_id == owner.organization.pk
    assert audit.user_id == owner.user.pk
    assert audit.tool_name == "alpha__add"
    assert audit.server_name == "alpha"
    assert audit.server_id == alpha_server["id"]
    assert audit.channel == CallChannel.HTTP
    assert audit.status == CallStatus.OK
    assert audit.is_error is False
    assert audit.duration_ms > 0
    assert audit.request_bytes == len(json.dumps({"a": 1, "b": 2}))
    assert audit.response_bytes == len(response.content)
    assert owner.token.startswith(audit.token_prefix)
    listed = owner.client().get("/api/v1/tool-calls").json()["results"]
    assert [row["tool"] for row in listed] == ["alpha__add"]
    assert listed[0]["status"] == "ok"


def test_two_upstreams_with_the_same_tool_name(owner: Actor, alpha: Upstream, beta: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    register(owner, "beta", beta.url)
    assert result_of(call(owner, "alpha__add", {"a": 1, "b": 2}))[0]["content"][0]["text"] == "3"
    assert result_of(call(owner, "beta__add", {"a": 1, "b": 2}))[0]["content"][0]["text"] == "beta:3"
    assert result_of(call(owner, "beta__tags.list", {"tags": ["x", "y"]}))[0]["content"][0]["text"] == "x,y"


def test_unreachable_upstream_is_502_and_others_keep_working(owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    down = register(owner, "down", "http://127.0.0.1:9/mcp")
    # Pretend it had tools from an earlier discovery: the tool exists, its upstream is gone.
    from toolapi.models import McpTool

    McpTool.objects.create(
        organization=owner.organization,
        server_id=down["id"],
        name="down__echo",
        upstream_name="echo",
        input_schema={"type": "object"},
    )
    response = call(owner, "down__echo", {})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    assert result_of(call(owner, "alpha__add", {"a": 1, "b": 2}))[0]["structuredContent"] == {"result": 3}
    statuses = sorted(ToolCall.objects.values_list("status", flat=True))
    assert statuses == [CallStatus.OK, CallStatus.UNREACHABLE]


def test_upstream_timeout_is_504(owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url, timeoutSeconds=0.5)
    response = call(owner, "alpha__slow", {"seconds": 3})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert ToolCall.objects.get().status == CallStatus.TIMEOUT


def test_anonymous_and_bad_tokens_are_401(alpha_server: dict[str, Any]) -> None:
    for path in ("/api/mcp-httpapi/openapi.json", "/api/mcp-httpapi/tools/alpha__add", "/api/mcp-httpapi/alpha__add"):
        response = Client().post(path, data="{}", content_type="application/json")
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        bad = Client(headers={"Authorization": "Bearer nope"}).get(path)
        assert bad.status_code == 401
        assert bad.json()["error"]["code"] == "authentication_failed"


def test_get_on_a_tool_is_405(owner: Actor, alpha_server: dict[str, Any]) -> None:
    assert owner.client().get("/api/mcp-httpapi/tools/alpha__add").status_code == 405
