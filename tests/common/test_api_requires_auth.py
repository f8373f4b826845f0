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
