"""The OpenAPI 3.1 document: validity, schema fidelity, $defs handling, caching and per-caller scope."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from accounts.models import Team
from tests.conftest import Actor, make_actor
from tests.toolapi.conftest import register
from tests.toolapi.upstreams import BetaState, Upstream
from toolapi import catalog, openapi
from toolapi.models import McpServer, McpTool

pytestmark = pytest.mark.django_db


def document(actor: Actor) -> dict[str, Any]:
    response = actor.client().get("/api/mcp-httpapi/openapi.json")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    return body


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            elif key == "discriminator" and isinstance(value, dict):
                yield from (v for v in value.get("mapping", {}).values())
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def request_schema(doc: dict[str, Any], tool: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][f"/api/mcp-httpapi/tools/{tool}"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    return schema


@pytest.fixture
def both(owner: Actor, alpha: Upstream, beta: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    register(owner, "beta", beta.url)


def test_document_validates_as_openapi_31(owner: Actor, both: None) -> None:
    doc = document(owner)
    assert doc["openapi"] == "3.1.0"
    OpenAPIV31SpecValidator(doc).validate()
    for ref in refs(doc):
        resolve(doc, ref)  # every reference, including discriminator mappings, points at something


def test_one_post_operation_per_tool(owner: Actor, both: None) -> None:
    doc = document(owner)
    tools = McpTool.objects.filter(organization=owner.organization).values_list("name", flat=True)
    assert set(doc["paths"]) == {f"/api/mcp-httpapi/tools/{name}" for name in tools}
    operation = doc["paths"]["/api/mcp-httpapi/tools/alpha__pick_color"]["post"]
    assert operation["operationId"] == "alpha__pick_color"
    assert operation["summary"] == "Pick a color"
    assert operation["description"] == "Pick a color and an intensity."
    assert operation["requestBody"]["required"] is True
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert resolve(doc, ok["$ref"]) == {
        "type": "object",
        "required": ["result", "isError"],
        "properties": {
            "result": {"type": "string", "description": openapi.RESULT_SCHEMA["properties"]["result"]["description"]},
            "isError": {"type": "boolean", "description": "Whether the tool reported an error."},
        },
    }
    assert set(operation["responses"]) >= {"200", "400", "401", "404", "502", "504"}
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["servers"] == [{"url": "http://testserver"}]


def test_schema_details_are_kept(owner: Actor, both: None) -> None:
    doc = document(owner)
    pick = request_schema(doc, "alpha__pick_color")
    assert pick["type"] == "object"
    assert pick["required"] == ["color"]
    assert pick["properties"]["color"]["enum"] == ["red", "green", "blue"]
    assert pick["properties"]["color"]["description"] == "Which color"
    intensity = pick["properties"]["intensity"]
    assert (intensity["minimum"], intensity["maximum"], intensity["default"]) == (1, 10, 5)
    assert intensity["description"] == "How strong"

    order = request_schema(doc, "alpha__create_order")
    assert "$defs" not in json.dumps(order)
    assert order["properties"]["customer"] == {"$ref": "#/components/schemas/alpha__Customer"}
    assert order["properties"]["items"]["type"] == "array"
    item = resolve(doc, order["properties"]["items"]["items"]["$ref"])
    assert item["properties"]["quantity"]["minimum"] == 1
    assert item["properties"]["quantity"]["maximum"] == 100
    customer = resolve(doc, "#/components/schemas/alpha__Customer")
    assert customer["properties"]["address"] == {"$ref": "#/components/schemas/alpha__Address"}
    address = resolve(doc, "#/components/schemas/alpha__Address")
    assert address["properties"]["country"]["enum"] == ["DE", "FR", "US"]
    assert address["properties"]["country"]["default"] == "DE"
    assert order["properties"]["note"]["anyOf"] == [{"type": "string"}, {"type": "null"}]

    shape = request_schema(doc, "alpha__draw")["properties"]["shape"]
    assert shape["oneOf"] == [
        {"$ref": "#/components/schemas/alpha__Circle"},
        {"$ref": "#/components/schemas/alpha__Square"},
    ]
    assert shape["discriminator"]["mapping"] == {
        "circle": "#/components/schemas/alpha__Circle",
        "square": "#/components/schemas/alpha__Square",
    }
    node = resolve(doc, "#/components/schemas/alpha__Node")
    assert node["properties"]["children"]["items"] == {"$ref": "#/components/schemas/alpha__Node"}


def test_same_definition_name_on_two_servers(owner: Actor, both: None) -> None:
    doc = document(owner)
    alpha_customer = resolve(doc, "#/components/schemas/alpha__Customer")
    beta_customer = resolve(doc, "#/components/schemas/beta__Customer")
    assert "address" in alpha_customer["properties"]
    assert "email" in beta_customer["properties"]
    assert request_schema(doc, "beta__register")["properties"]["customer"] == {
        "$ref": "#/components/schemas/beta__Customer"
    }


def _tool(server: str, name: str, schema: dict[str, Any]) -> McpTool:
    return McpTool(name=f"{server}__{name}", upstream_name=name, input_schema=schema, server=McpServer(name=server))


def test_definitions_with_one_name_and_different_content_on_one_server() -> None:
    first = _tool(
        "s",
        "a",
        {
            "type": "object",
            "$defs": {"Thing": {"type": "string"}},
            "properties": {"x": {"$ref": "#/$defs/Thing"}},
        },
    )
    same = _tool(
        "s",
        "b",
        {
            "type": "object",
            "$defs": {"Thing": {"type": "string"}},
            "properties": {"y": {"$ref": "#/$defs/Thing"}},
        },
    )
    different = _tool(
        "s",
        "c",
        {
            "type": "object",
            "$defs": {"Thing": {"type": "integer"}, "Other": {"$ref": "#/$defs/Thing"}},
            "properties": {"z": {"$ref": "#/$defs/Other"}},
        },
    )
    doc = openapi.build_document([first, same, different], server_url="http://x", title="t")
    OpenAPIV31SpecValidator(doc).validate()
    schemas = doc["components"]["schemas"]
    assert schemas["s__Thing"] == {"type": "string"}
    assert request_schema(doc, "s__b")["properties"]["y"] == {"$ref": "#/components/schemas/s__Thing"}
    # The differing tool gets names of its own, and its internal reference follows.
    z = request_schema(doc, "s__c")["properties"]["z"]
    assert z == {"$ref": "#/components/schemas/s__c__Other"}
    assert schemas["s__c__Other"] == {"$ref": "#/components/schemas/s__c__Thing"}
    assert schemas["s__c__Thing"] == {"type": "integer"}


def test_references_to_the_root_schema_move_it_to_components() -> None:
    tree = _tool(
        "s",
        "tree",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["value"],
        },
    )
    doc = openapi.build_document([tree], server_url="http://x", title="t")
    OpenAPIV31SpecValidator(doc).validate()
    assert request_schema(doc, "s__tree") == {"$ref": "#/components/schemas/s__tree__Input"}
    root = doc["components"]["schemas"]["s__tree__Input"]
    assert "$schema" not in root
    assert root["properties"]["children"]["items"] == {"$ref": "#/components/schemas/s__tree__Input"}


def test_document_is_cached_and_invalidated_by_tool_changes(
    owner: Actor, beta_pair: tuple[Upstream, BetaState], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mcp_types as types

    upstream, state = beta_pair
    server = register(owner, "beta", upstream.url)
    builds: list[int] = []
    real_build = catalog.build_document

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        builds.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(catalog, "build_document", counting)
    first = owner.client().get("/api/mcp-httpapi/openapi.json").content
    second = owner.client().get("/api/mcp-httpapi/openapi.json").content
    assert first == second
    assert len(builds) == 1

    # An unchanged rediscovery keeps the cache.
    assert owner.client().post(f"/api/v1/mcp-servers/{server['id']}/refresh").status_code == 200
    owner.client().get("/api/mcp-httpapi/openapi.json")
    assert len(builds) == 1

    state.tools.append(
        types.Tool(name="ping", description="Added later.", input_schema={"type": "object", "properties": {}})
    )
    try:
        assert owner.client().post(f"/api/v1/mcp-servers/{server['id']}/refresh").status_code == 200
        third = document(owner)
    finally:
        state.tools.pop()
    assert len(builds) == 2
    assert "/api/mcp-httpapi/tools/beta__ping" in third["paths"]

    # Settings that shape the catalog invalidate it too.
    owner.client().patch(
        f"/api/v1/mcp-servers/{server['id']}", data={"enabled": False}, content_type="application/json"
    )
    assert document(owner)["paths"] == {}


def test_each_caller_sees_only_their_tools(
    owner: Actor, teammate: Actor, outsider: Actor, team: Team, alpha: Upstream, beta: Upstream
) -> None:
    register(owner, "alpha", alpha.url)
    register(owner, "beta", beta.url, visibility="teams", teamIds=[team.pk])
    other = make_actor("acme", "other@acme.test")
    paths_of = {actor.user.email: set(document(actor)["paths"]) for actor in (owner, teammate, other, outsider)}
    assert any("beta__" in p for p in paths_of["mate@acme.test"])
    assert not any("beta__" in p for p in paths_of["other@acme.test"])
    assert any("alpha__" in p for p in paths_of["other@acme.test"])
    # Owners manage every server but use tools under the same rule as everyone.
    assert not any("beta__" in p for p in paths_of["owner@acme.test"])
    assert paths_of["someone@globex.test"] == set()


def test_read_only_token_reads_the_document(sandbox_actor: Actor, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    assert "/api/mcp-httpapi/tools/alpha__add" in document(sandbox_actor)["paths"]
