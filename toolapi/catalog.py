"""The caller's published catalog: the OpenAPI document, cached, and the result serialization."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import mcp_types as types

from common.principal import Principal
from toolapi import selectors
from toolapi.openapi import build_document

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
