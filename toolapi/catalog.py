"""The caller's published catalog: the OpenAPI document and tool lookups, cached, and the result serialization."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.conf import settings

from common.principal import Principal
from toolapi import selectors
from toolapi.models import McpTool
from toolapi.openapi import build_document
from toolapi.upstream import UpstreamTarget

_DOC_CACHE_SIZE = 256
_docs: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_docs_lock = threading.Lock()


def openapi_bytes(*, principal: Principal, server_url: str) -> bytes:
    """The serialized OpenAPI document for this caller.

    Keyed by the organization, the address the caller used and the fingerprint of the servers the
    caller may use (see selectors.catalog_fingerprint): callers with the same access share an entry,
    and any change to a server or its tools produces a new key, which is the invalidation. The cache
    is per process; the key comes from the database, so processes never serve each other stale data.
    """
    key = (principal.organization.pk, server_url, selectors.catalog_fingerprint(principal=principal))
    with _docs_lock:
        cached = _docs.get(key)
        if cached is not None:
            _docs.move_to_end(key)
            return cached
    tools = list(selectors.catalog_tools(principal=principal))
    document = build_document(tools, server_url=server_url, title=f"{principal.organization.name} tools")
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    with _docs_lock:
        _docs[key] = body
        while len(_docs) > _DOC_CACHE_SIZE:
            _docs.popitem(last=False)
    return body


def clear_cache() -> None:
    with _docs_lock:
        _docs.clear()
    forget_tools()


# -- tool lookups for calls ------------------------------------------------------------------------
#
# Every call needs "the tool this caller may call under this name" and its upstream address (whose
# headers are decrypted). Both are kept for TOOL_CACHE_SECONDS per (organization, user, name). Any
# change made through toolapi.services in this process (a server disabled, deleted, re-shared,
# re-pointed; tools rediscovered) drops every entry at once; changes made elsewhere (another process,
# team membership) take effect within the bound. Unknown names are not cached, so a newly discovered
# tool is callable right away.

DEFAULT_TOOL_CACHE_SECONDS = 2.0
_TOOL_CACHE_MAX = 10_000


@dataclass(frozen=True)
class CallableTool:
    tool: McpTool
    target: UpstreamTarget


_tools: dict[tuple[str, str, str], tuple[CallableTool, float]] = {}
_tools_lock = threading.Lock()
_tools_generation = 0


def _tool_ttl() -> float:
    return float(getattr(settings, "TOOL_CACHE_SECONDS", DEFAULT_TOOL_CACHE_SECONDS))


def _tool_key(principal: Principal, name: str) -> tuple[str, str, str]:
    return (principal.organization.pk, principal.user.pk, name)


def cached_tool(*, principal: Principal, name: str) -> CallableTool | None:
    """The cached lookup, if fresh; never touches the database (safe on the event loop)."""
    entry = _tools.get(_tool_key(principal, name))
    if entry is None or time.monotonic() >= entry[1]:
        return None
    return entry[0]


def tool_for_call(*, principal: Principal, name: str) -> CallableTool | None:
    """The tool ``principal`` may call as ``name`` with its upstream target, or None (404)."""
    found = cached_tool(principal=principal, name=name)
    if found is not None:
        return found
    generation = _tools_generation
    tool = selectors.tool_for_call(principal=principal, name=name)
    if tool is None:
        return None
    # Imported here: services imports this module to invalidate it.
    from toolapi.services import target_for

    found = CallableTool(tool=tool, target=target_for(tool.server))
    ttl = _tool_ttl()
    if ttl > 0:
        with _tools_lock:
            if generation == _tools_generation:
                if len(_tools) >= _TOOL_CACHE_MAX:
                    _tools.clear()
                _tools[_tool_key(principal, name)] = (found, time.monotonic() + ttl)
    return found


def forget_tools() -> None:
    """Drop every cached tool lookup of this process (the catalog or a server's settings changed)."""
    global _tools_generation
    with _tools_lock:
        _tools_generation += 1
        _tools.clear()


def serialize_result(result: types.CallToolResult) -> dict[str, Any]:
    """The HTTP API's response body for a tool result.

    ``result`` is the MCP result as a JSON string: ``{"content": [...]}`` with the content blocks as
    MCP defines them (text, image, audio, resource_link, resource), plus ``structuredContent`` when
    the tool returned structured output. Protocol bookkeeping (``_meta``, ``resultType``) is left out.
    """
    payload: dict[str, Any] = {
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
    }
    if result.structured_content is not None:
        payload["structuredContent"] = result.structured_content
    return {
        "result": json.dumps(payload, separators=(",", ":"), ensure_ascii=False),
        "isError": bool(result.is_error),
    }
