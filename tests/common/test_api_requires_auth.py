"""Every endpoint under /api/ refuses an anonymous caller with 401 and the JSON error body.

The URL map is walked at test time, so endpoints added later are covered without editing this test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

# Endpoints that are public by design. Each needs a reason.
PUBLIC = {
    # RFC 8693 token exchange: the caller proves itself with the subject token in the body.
    "api/v1/auth/token-exchange",
}

_CONVERTER = re.compile(r"<(?:(?P<conv>\w+):)?(?P<name>\w+)>")
_SAMPLE = {"int": "1", "slug": "nothing-here", "uuid": "00000000-0000-0000-0000-000000000000", "path": "nothing/here"}


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[str]:
    for entry in patterns:
        route = str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + route)
        elif isinstance(entry, URLPattern):
            yield prefix + route


def api_paths() -> list[str]:
    found = []
    for route in _walk(get_resolver().url_patterns):
        if not route.startswith("api/") or route.startswith("^"):
            continue
        concrete = _CONVERTER.sub(lambda m: _SAMPLE.get(m.group("conv") or "str", "nothing-here"), route)
        found.append(concrete.rstrip("$"))
    return sorted(set(found))


def test_the_walk_finds_the_api() -> None:
    paths = api_paths()
    assert "api/v1/me" in paths
    assert "api/v1/organization" in paths
    assert "api/docs" in paths


@pytest.mark.django_db
@pytest.mark.parametrize("path", api_paths())
@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_anonymous_gets_401(anon: Client, path: str, method: str) -> None:
    if path in PUBLIC:
        pytest.skip("public by design")
    response = getattr(anon, method)("/" + path, content_type="application/json", data={} if method != "get" else None)
    assert response.status_code == 401, (path, method, response.status_code, response.content[:200])
    assert response["WWW-Authenticate"].startswith("Bearer")
    body = response.json()
    assert body["error"]["code"] in {"not_authenticated", "authentication_failed"}
    assert body["error"]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", api_paths())
def test_bad_token_gets_401(path: str) -> None:
    if path in PUBLIC:
        pytest.skip("public by design")
    client = Client(HTTP_AUTHORIZATION="Bearer svc_pat_not-a-real-token")
    response = client.get("/" + path)
    assert response.status_code == 401, (path, response.status_code)
    assert response.json()["error"]["code"] == "authentication_failed"


def asgi_mounted_paths() -> list[str]:
    """Paths answered by layers of the served ASGI application in front of Django's URLconf.

    Every layer is accounted for: a new one makes this fail until its paths are listed here, so
    nothing mounted outside the URLconf escapes the 401 checks.
    """
    from django.core.handlers.asgi import ASGIHandler

    from common.fastpath import DirectAsgi
    from config.asgi import application
    from toolapi.mcp_endpoint import MCP_PATHS, WithMcpEndpoint

    paths: list[str] = []
    layer = application.application_mapping["http"]
    while not isinstance(layer, ASGIHandler):
        if isinstance(layer, WithMcpEndpoint):
            paths.extend(path.lstrip("/") for path in MCP_PATHS)
        elif not isinstance(layer, DirectAsgi):  # serves URLconf routes only (see test_fast_path)
            raise AssertionError(f"unknown ASGI layer {type(layer).__name__}: list the paths it serves")
        layer = layer.app
    return paths


def test_the_served_application_refuses_anonymous_callers_everywhere(live: Any) -> None:
    # Through the real ASGI application and server: the routes served in front of Django (the MCP
    # endpoint, the streaming fast paths) answer exactly as the URLconf's do.
    import httpx

    paths = [p for p in [*api_paths(), *asgi_mounted_paths()] if p not in PUBLIC]
    assert "api/mcp" in paths
    with httpx.Client(base_url=live.url, timeout=30) as client:
        for path in paths:
            for method in ("GET", "POST"):
                response = client.request(method, "/" + path, json={})
                assert response.status_code == 401, (method, path, response.status_code, response.text[:200])
                assert response.headers["www-authenticate"].startswith("Bearer"), (method, path)
                assert response.json()["error"]["code"] in {"not_authenticated", "authentication_failed"}
