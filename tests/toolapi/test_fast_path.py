"""The tool HTTP API served from ASGI in front of Django (toolapi/asgi.py).

Its routes must be the URLconf's, it must account for every middleware, and over a live uvicorn it
must answer exactly what Django's own request cycle answers (the Django test client goes through
that cycle): statuses, error bodies, headers. Plus the fast path's own duties: the short-lived caches
honour revocations and catalog changes, and calls are still audited.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.test import Client
from django.urls import Resolver404, resolve

from accounts import services as account_services
from accounts.models import ApiToken, hash_token
from common.auth import DEFAULT_PRINCIPAL_CACHE_SECONDS, forget_cached_principals
from tests.conftest import Actor
from tests.live import LiveServer
from tests.toolapi.conftest import register, wait_for
from tests.toolapi.upstreams import Upstream
from toolapi import views
from toolapi.asgi import WithToolHttpApi, route
from toolapi.models import CallChannel, CallStatus, ToolCall

# Headers Django's middleware adds or an error response carries; the fast path must send the same.
COMPARED_HEADERS = (
    "content-type",
    "www-authenticate",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
    "allow",
)


@pytest.fixture(autouse=True)
def _no_cached_principals() -> Iterator[None]:
    forget_cached_principals()
    yield
    forget_cached_principals()


# -- without a server ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/mcp-httpapi/openapi.json",
        "/api/mcp-httpapi/tools/alpha__add",
        "/api/mcp-httpapi/alpha__add",
        "/api/mcp-httpapi/tools",
        "/api/mcp-httpapi/tools/",
        "/api/mcp-httpapi/tools/a/b",
        "/api/mcp-httpapi/tools/alpha__add/",
        "/api/mcp-httpapi/",
        "/api/mcp-httpapi",
        "/api/mcp-httpapi/openapi.json/",
        "/api/mcp-httpapi/beta__tags.list",
        "/api/v1/me",
    ],
)
def test_routes_are_the_urlconfs(path: str) -> None:
    found = route(path)
    try:
        match = resolve(path)
    except Resolver404:
        assert found is None
        return
    if match.func in (views.call_tool, views.openapi_json):
        assert found == (match.func, match.kwargs)
    else:
        assert found is None


def test_every_middleware_is_accounted_for() -> None:
    assert WithToolHttpApi(ASGIHandler()).enabled


def test_the_served_application_uses_the_fast_path() -> None:
    from config.asgi import application

    http = application.application_mapping["http"]
    assert isinstance(http.app, WithToolHttpApi)
    assert http.app.enabled


def test_an_unknown_middleware_turns_the_fast_path_off(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    assert not WithToolHttpApi(ASGIHandler()).enabled


class _RecordingDjango(ASGIHandler):
    """Stands in for Django: records what it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.handled: list[tuple[str, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.handled.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _asgi_post(app: Any, path: str, host: str, body: bytes) -> int:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "headers": [(b"host", host.encode()), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status: int = sent[0]["status"]
    return status


def test_requests_django_would_refuse_are_handed_to_django_with_their_body(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["good.test"]
    django = _RecordingDjango()
    app = WithToolHttpApi(django)
    assert _asgi_post(app, "/api/mcp-httpapi/tools/alpha__add", "evil.test", b'{"a": 1}') == 418
    assert django.handled == [("/api/mcp-httpapi/tools/alpha__add", b'{"a": 1}')]
    # Other paths always go to Django.
    assert _asgi_post(app, "/api/v1/me", "good.test", b"{}") == 418
    assert django.handled[-1] == ("/api/v1/me", b"{}")


# -- over a live uvicorn, compared with Django's own cycle ------------------------------------------


def _django(actor_token: str | None, method: str, path: str, body: bytes, content_type: str | None) -> Any:
    headers = {"Authorization": f"Bearer {actor_token}"} if actor_token else {}
    client = Client(headers=headers)
    if method == "GET":
        return client.get(path)
    return client.generic(method, path, data=body, content_type=content_type or "")


def _live(
    live_app: LiveServer, actor_token: str | None, method: str, path: str, body: bytes, content_type: str | None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {actor_token}"} if actor_token else {}
    if content_type:
        headers["Content-Type"] = content_type
    return httpx.request(method, f"{live_app.url}{path}", content=body, headers=headers, timeout=30)


def _multipart() -> tuple[bytes, str]:
    boundary = "fastpathboundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in (("a", "5"), ("b", "6"))
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.django_db(transaction=True)
def test_the_fast_path_answers_what_django_answers(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    tool = "/api/mcp-httpapi/tools/alpha__add"
    multipart, multipart_type = _multipart()
    too_big = b'{"a": 1, "b": 2, "pad": "' + b"x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE + b'"}'
    cases: list[tuple[str, str | None, str, str, bytes, str | None]] = [
        ("anonymous", None, "POST", tool, b"{}", "application/json"),
        ("bad token", "svc_pat_nope", "POST", tool, b"{}", "application/json"),
        ("GET on a tool", owner.token, "GET", tool, b"", None),
        ("unknown tool", owner.token, "POST", "/api/mcp-httpapi/tools/alpha__nope", b"{}", "application/json"),
        ("media type", owner.token, "POST", tool, b"a", "text/plain"),
        ("malformed JSON", owner.token, "POST", tool, b"{", "application/json"),
        ("validation", owner.token, "POST", tool, b'{"a": "x"}', "application/json"),
        ("JSON", owner.token, "POST", tool, b'{"a": 1, "b": 2}', "application/json"),
        ("empty body", owner.token, "POST", "/api/mcp-httpapi/tools/alpha__fail", b"", None),
        ("form", owner.token, "POST", tool, b"a=3&b=4", "application/x-www-form-urlencoded"),
        ("multipart", owner.token, "POST", tool, multipart, multipart_type),
        ("short form", owner.token, "POST", "/api/mcp-httpapi/alpha__add", b'{"a": 2, "b": 2}', "application/json"),
        ("too large", owner.token, "POST", tool, too_big, "application/json"),
        ("openapi POST", owner.token, "POST", "/api/mcp-httpapi/openapi.json", b"", None),
        ("openapi anonymous", None, "GET", "/api/mcp-httpapi/openapi.json", b"", None),
    ]
    statuses = {}
    for name, token, method, path, body, content_type in cases:
        expected = _django(token, method, path, body, content_type)
        got = _live(live_app, token, method, path, body, content_type)
        statuses[name] = got.status_code
        assert got.status_code == expected.status_code, name
        assert got.json() == expected.json(), name
        for header in COMPARED_HEADERS:
            assert got.headers.get(header) == expected.headers.get(header), (name, header)
    assert statuses == {
        "anonymous": 401,
        "bad token": 401,
        "GET on a tool": 405,
        "unknown tool": 404,
        "media type": 415,
        "malformed JSON": 400,
        "validation": 400,
        "JSON": 200,
        "empty body": 200,
        "form": 200,
        "multipart": 200,
        "short form": 200,
        "too large": 413,
        "openapi POST": 405,
        "openapi anonymous": 401,
    }

    # The document differs only in the address the caller used.
    expected_doc = _django(owner.token, "GET", "/api/mcp-httpapi/openapi.json", b"", None).json()
    got_doc = _live(live_app, owner.token, "GET", "/api/mcp-httpapi/openapi.json", b"", None).json()
    assert got_doc["servers"] == [{"url": live_app.url}]
    assert {**got_doc, "servers": None} == {**expected_doc, "servers": None}


@pytest.mark.django_db(transaction=True)
def test_fast_path_calls_are_audited(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    body = json.dumps({"a": 1, "b": 2}).encode()
    response = _live(live_app, owner.token, "POST", "/api/mcp-httpapi/tools/alpha__add", body, "application/json")
    assert response.status_code == 200
    assert wait_for(lambda: ToolCall.objects.exists())
    audit = ToolCall.objects.get()
    assert (audit.channel, audit.status, audit.is_error) == (CallChannel.HTTP, CallStatus.OK, False)
    assert (audit.tool_name, audit.server_name, audit.user_id) == ("alpha__add", "alpha", owner.user.pk)
    assert audit.request_bytes == len(body)
    assert audit.response_bytes == len(response.content)
    assert audit.duration_ms > 0


@pytest.mark.django_db(transaction=True)
def test_anonymous_is_401_on_the_fast_path(live_app: LiveServer, owner: Actor, alpha: Upstream) -> None:
    register(owner, "alpha", alpha.url)
    for path in ("/api/mcp-httpapi/tools/alpha__add", "/api/mcp-httpapi/alpha__add", "/api/mcp-httpapi/openapi.json"):
        response = httpx.post(f"{live_app.url}{path}", json={"a": 1, "b": 2})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="api"'
        assert response.json()["error"]["code"] == "not_authenticated"
    assert not ToolCall.objects.exists()


def _call(live_app: LiveServer, token: str) -> int:
    response = httpx.post(
        f"{live_app.url}/api/mcp-httpapi/tools/alpha__add",
        json={"a": 1, "b": 2},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    return response.status_code


@pytest.mark.django_db(transaction=True)
def test_a_token_revoked_elsewhere_stops_working_within_the_bound(
    live_app: LiveServer, owner: Actor, alpha: Upstream
) -> None:
    register(owner, "alpha", alpha.url)
    assert _call(live_app, owner.token) == 200  # now cached in the server process
    # Revoked by this (test) process: the server process only learns it from the database.
    account_services.revoke_token(token=ApiToken.objects.get(token_hash=hash_token(owner.token)))
    revoked_at = time.monotonic()
    assert wait_for(lambda: _call(live_app, owner.token) == 401, timeout=DEFAULT_PRINCIPAL_CACHE_SECONDS + 5)
    assert time.monotonic() - revoked_at < DEFAULT_PRINCIPAL_CACHE_SECONDS + 1.0


@pytest.mark.django_db(transaction=True)
def test_a_token_revoked_through_the_server_stops_working_at_once(
    live_app: LiveServer, owner: Actor, alpha: Upstream
) -> None:
    register(owner, "alpha", alpha.url)
    second = account_services.create_token(user=owner.user, organization=owner.organization, name="second")
    assert _call(live_app, second.raw) == 200
    revoked = httpx.delete(f"{live_app.url}/api/v1/tokens/{second.token.pk}", headers=owner.auth)
    assert revoked.status_code == 204
    assert _call(live_app, second.raw) == 401


@pytest.mark.django_db(transaction=True)
def test_a_server_disabled_through_the_server_is_404_at_once(
    live_app: LiveServer, owner: Actor, alpha: Upstream
) -> None:
    server = register(owner, "alpha", alpha.url)
    assert _call(live_app, owner.token) == 200  # the tool lookup is now cached in the server process
    changed = httpx.patch(
        f"{live_app.url}/api/v1/mcp-servers/{server['id']}", json={"enabled": False}, headers=owner.auth
    )
    assert changed.status_code == 200
    assert _call(live_app, owner.token) == 404
