"""The OpenAPI 3.1 document of the tools a caller may use.

OpenAPI 3.1 schema objects are JSON Schema 2020-12, so a tool's input schema is published as the
upstream wrote it (enum, minimum, maximum, defaults, nesting, anyOf/oneOf, ...). The one rewrite is
for references: ``$defs``/``definitions`` move to ``components/schemas`` (a document has one
namespace there, so two tools' definitions with the same name but different content get distinct
names) and every local ``$ref`` is pointed at the new place.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from typing import Any

from toolapi.models import McpTool

HTTPAPI_PREFIX = "/api/mcp-httpapi"
_COMPONENT_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_DEF_KEYS = ("$defs", "definitions")

RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["result", "isError"],
    "properties": {
        "result": {
            "type": "string",
            "description": "The tool's MCP result serialized as a JSON string: "
            '{"content": [content blocks], "structuredContent": <value, when the tool returned one>}.',
        },
        "isError": {"type": "boolean", "description": "Whether the tool reported an error."},
    },
}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
        }
    },
}
_ERRORS = {
    "400": "The arguments do not match the tool's input schema (details.errors lists path and rule).",
    "401": "Missing or invalid bearer token.",
    "404": "No such tool for this caller.",
    "502": "The upstream MCP server is unreachable or failed.",
    "504": "The upstream MCP server did not answer in time.",
}


def _component_name(raw: str) -> str:
    return _COMPONENT_UNSAFE.sub("_", raw) or "_"


class _Components:
    """The document's ``components/schemas``, remembering what each shared definition was made from."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"ToolCallResult": RESULT_SCHEMA, "Error": ERROR_SCHEMA}
        # name -> the raw upstream definition it was published from (server-level names only).
        self._raw: dict[str, str] = {}

    def free_or_same(self, name: str, raw: str) -> bool:
        return name not in self.schemas or self._raw.get(name) == raw

    def claim(self, name: str) -> str:
        final, counter = name, 2
        while final in self.schemas:
            final = f"{name}_{counter}"
            counter += 1
        self.schemas[final] = {}
        return final

    def put(self, name: str, schema: Any, raw: str | None = None) -> None:
        self.schemas[name] = schema
        if raw is not None:
            self._raw[name] = raw


def _rewrite_refs(node: Any, mapping: dict[str, str], root_component: str | None) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = _map_ref(value, mapping, root_component)
            elif key == "discriminator" and isinstance(value, dict) and isinstance(value.get("mapping"), dict):
                # OpenAPI discriminator mappings hold references too (pydantic emits them for tagged unions).
                mapped = {
                    tag: _map_ref(target, mapping, root_component)
                    if isinstance(target, str) and target.startswith("#")
                    else target
                    for tag, target in value["mapping"].items()
                }
                out[key] = {**value, "mapping": mapped}
            else:
                out[key] = _rewrite_refs(value, mapping, root_component)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(item, mapping, root_component) for item in node]
    return node


def _map_ref(ref: str, mapping: dict[str, str], root_component: str | None) -> str:
    pointer = ref[1:]
    # Longest prefix first: a nested definition (/$defs/A/$defs/B) has its own component.
    for prefix, target in sorted(mapping.items(), key=lambda item: -len(item[0])):
        if pointer == prefix or pointer.startswith(prefix + "/"):
            return "#/components/schemas/" + target + pointer[len(prefix) :]
    if root_component is not None:
        # A pointer into the tool's own schema ("#", "#/properties/x"): it now lives in components.
        return f"#/components/schemas/{root_component}{pointer}"
    return ref


def _needs_root_component(node: Any, def_prefixes: set[str]) -> bool:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                pointer = value[1:]
                if not any(pointer == p or pointer.startswith(p + "/") for p in def_prefixes):
                    return True
            elif _needs_root_component(value, def_prefixes):
                return True
    elif isinstance(node, list):
        return any(_needs_root_component(item, def_prefixes) for item in node)
    return False


def _collect_defs(schema: dict[str, Any], path: str, found: list[tuple[str, str, Any]]) -> None:
    """Every definition block, nested ones included: (json pointer prefix, name, schema)."""
    for key in _DEF_KEYS:
        block = schema.get(key)
        if isinstance(block, dict):
            for name, definition in block.items():
                escaped = name.replace("~", "~0").replace("/", "~1")
                prefix = f"{path}/{key}/{escaped}"
                found.append((prefix, name, definition))
                if isinstance(definition, dict):
                    _collect_defs(definition, prefix, found)


def _strip_defs(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _strip_defs(value) for key, value in node.items() if key not in _DEF_KEYS}
    if isinstance(node, list):
        return [_strip_defs(item) for item in node]
    return node


def tool_input_schema(tool: McpTool, server_name: str, components: _Components) -> Any:
    schema = copy.deepcopy(tool.input_schema) if isinstance(tool.input_schema, dict) else {"type": "object"}
    # $id would re-base every relative reference and $schema is set document-wide (jsonSchemaDialect).
    schema.pop("$id", None)
    schema.pop("$schema", None)
    defs: list[tuple[str, str, Any]] = []
    _collect_defs(schema, "", defs)
    raw = {prefix: json.dumps(definition, sort_keys=True) for prefix, _, definition in defs}

    # Tools of one server usually share models (same generator, same names): publish them once under
    # `<server>__<Name>`. When any name is already used by different content (another server, or a
    # tool whose model of the same name differs), all of this tool's definitions take names scoped
    # to the tool instead, so its references stay mutually consistent.
    shared = {prefix: _component_name(f"{server_name}__{name}") for prefix, name, _ in defs}
    use_shared = len(set(shared.values())) == len(shared) and all(
        components.free_or_same(shared[prefix], raw[prefix]) for prefix in shared
    )
    final: dict[str, str] = {}
    for prefix, name, _ in defs:
        final[prefix] = shared[prefix] if use_shared else components.claim(_component_name(f"{tool.name}__{name}"))

    prefixes = set(final)
    root_component = None
    if _needs_root_component(schema, prefixes):
        root_component = components.claim(_component_name(f"{tool.name}__Input"))
    for prefix, _name, definition in defs:
        name = final[prefix]
        if use_shared and components.schemas.get(name):
            continue  # identical definition already published by a sibling tool
        components.put(
            name,
            _strip_defs(_rewrite_refs(definition, final, root_component)),
            raw[prefix] if use_shared else None,
        )
    body = _strip_defs(_rewrite_refs(schema, final, root_component))
    if root_component is not None:
        components.put(root_component, body)
        return {"$ref": f"#/components/schemas/{root_component}"}
    return body


def _summary(tool: McpTool) -> str:
    if tool.title:
        return tool.title
    first = (tool.description or "").strip().splitlines()
    return first[0][:200] if first else tool.name


def build_document(tools: Iterable[McpTool], *, server_url: str, title: str) -> dict[str, Any]:
    components = _Components()
    paths: dict[str, Any] = {}
    for tool in tools:
        request_schema = tool_input_schema(tool, tool.server.name, components)
        responses: dict[str, Any] = {
            "200": {
                "description": "The tool ran. A tool-level failure is still 200, with isError true.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ToolCallResult"}}},
            }
        }
        for status, description in _ERRORS.items():
            responses[status] = {
                "description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        operation: dict[str, Any] = {
            "operationId": tool.name,
            "summary": _summary(tool),
            "description": tool.description or _summary(tool),
            "tags": [tool.server.name],
            "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
            "responses": responses,
        }
        paths[f"{HTTPAPI_PREFIX}/tools/{tool.name}"] = {"post": operation}
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": title,
            "version": "1.0.0",
            "description": (
                "Every MCP tool available to the caller, as plain HTTP. POST the tool's arguments as "
                "JSON (or form fields). Send `Accept: text/event-stream` for long calls: comment lines "
                "(`: keepalive`) arrive while the tool runs, then one `data:` event with the JSON result."
            ),
        },
        "servers": [{"url": server_url}],
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {
            "schemas": components.schemas,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }
