"""exec, read-file and write-file served from ASGI in front of Django (sandboxes/api/asgi.py).

Their routes must be the URLconf's, and over a live server they must answer exactly what Django's
own request cycle answers (the Django test client goes through that cycle): statuses, error
bodies, headers. Successful operations through the fast path are what the rest of tests/sandboxes
drives, since the live server serves config.asgi.application.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client
from django.urls import Resolver404, resolve
from django.utils import timezone

from common.auth import forget_cached_principals
from sandboxes.api import streaming
from sandboxes.api.asgi import SandboxStreamRoutes, route
from sandboxes.models import DestroyReason, Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from tests.conftest import Actor
from tests.live import LiveServer, start_live_server, stop_live_server

COMPARED_HEADERS = (
    "content-type",
    "www-authenticate",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
    "allow",
    "vary",
    "cache-control",
)
WRITE_LIMIT = 1000


@pytest.fixture(autouse=True)
def _no_cached_principals() -> Iterator[None]:
    forget_cached_principals()
    yield
    forget_cached_principals()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/sandboxes/sbx_1/exec",
        "/api/v1/sandboxes/sbx_1/read-file",
        "/api/v1/sandboxes/sbx_1/write-file",
        "/api/v1/sandboxes/sbx_1/exec/",
        "/api/v1/sandboxes/sbx_1/other",
        "/api/v1/sandboxes//exec",
        "/api/v1/sandboxes/exec",
        "/api/v1/sandboxes/a/b/exec",
        "/api/v1/sandboxes/sbx_1",
        "/api/v1/sandboxes",
        "/api/v1/sandboxes/",
        "/api/mcp-httpapi/tools/alpha__add",
    ],
)
def test_routes_are_the_urlconfs(path: str) -> None:
    found = route(path)
    try:
        match = resolve(path)
    except Resolver404:
        assert found is None
        return
    if match.func in (streaming.exec_view, streaming.read_file_view, streaming.write_file_view):
        assert found == (match.func, match.kwargs)
    else:
        assert found is None


def test_the_served_application_serves_the_streams_directly() -> None:
    from config.asgi import application

    http = application.application_mapping["http"]
    assert http.app.enabled
    assert any(isinstance(routes, SandboxStreamRoutes) for routes in http.app.routes)


@pytest.fixture
def small_writes(transactional_db: Any, settings: Any) -> Iterator[LiveServer]:
    settings.SANDBOX_WRITE_MAX_BYTES = WRITE_LIMIT
    server = start_live_server({"SANDBOX_WRITE_MAX_BYTES": str(WRITE_LIMIT)})
    try:
        yield server
    finally:
        stop_live_server(server)


def _django(token: str | None, method: str, path: str, body: bytes, content_type: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = Client(headers=headers)
    if method == "GET":
        return client.get(path)
    return client.generic(method, path, data=body, content_type=content_type or "")


def _live(
    server: LiveServer, token: str | None, method: str, path: str, body: bytes, content_type: str | None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type:
        headers["Content-Type"] = content_type
    return httpx.request(method, f"{server.url}{path}", content=body, headers=headers, timeout=30)


def test_the_fast_path_answers_what_django_answers(small_writes: LiveServer, enabled: Actor) -> None:
    gone = Sandbox.objects.create(
        organization=enabled.organization,
        runtime="local",
        last_activity_at=timezone.now(),
        status=SandboxStatus.DESTROYED,
        destroy_reason=DestroyReason.USER,
        destroyed_at=timezone.now(),
    )
    token = enabled.token
    json_type = "application/json"
    octets = "application/octet-stream"
    base = "/api/v1/sandboxes"
    cases: list[tuple[str, str | None, str, str, bytes, str | None]] = []
    for action, body, content_type in (
        ("exec", b'{"command": "true"}', json_type),
        ("read-file?path=/etc/hostname", b"", None),
        ("write-file?path=/tmp/x", b"data", octets),
    ):
        name = action.partition("?")[0]
        cases += [
            (f"{name} anonymous", None, "POST", f"{base}/sbx_nope/{action}", body, content_type),
            (f"{name} bad token", "svc_pat_nope", "POST", f"{base}/sbx_nope/{action}", body, content_type),
            (f"{name} GET", token, "GET", f"{base}/sbx_nope/{action}", b"", None),
            (f"{name} anonymous GET", None, "GET", f"{base}/sbx_nope/{action}", b"", None),
            (f"{name} unknown sandbox", token, "POST", f"{base}/sbx_nope/{action}", body, content_type),
            (f"{name} destroyed sandbox", token, "POST", f"{base}/{gone.pk}/{action}", body, content_type),
        ]
    cases += [
        ("exec malformed JSON", token, "POST", f"{base}/sbx_nope/exec", b"{", json_type),
        ("exec not an object", token, "POST", f"{base}/sbx_nope/exec", b"[]", json_type),
        ("exec validation", token, "POST", f"{base}/sbx_nope/exec", b'{"command": 1}', json_type),
        ("read-file no path", token, "POST", f"{base}/sbx_nope/read-file", b"", None),
        ("read-file relative path", token, "POST", f"{base}/sbx_nope/read-file?path=etc", b"", None),
        ("write-file media type", token, "POST", f"{base}/sbx_nope/write-file?path=/tmp/x", b"x", "text/plain"),
        ("write-file relative path", token, "POST", f"{base}/sbx_nope/write-file?path=x", b"x", octets),
        (
            "write-file too large",
            token,
            "POST",
            f"{base}/sbx_nope/write-file?path=/tmp/x",
            b"x" * (WRITE_LIMIT + 1),
            octets,
        ),
    ]
    statuses = {}
    for name, case_token, method, path, body, content_type in cases:
        expected = _django(case_token, method, path, body, content_type)
        got = _live(small_writes, case_token, method, path, body, content_type)
        statuses[name] = got.status_code
        assert got.status_code == expected.status_code, name
        assert got.json() == expected.json(), name
        for header in COMPARED_HEADERS:
            assert got.headers.get(header) == expected.headers.get(header), (name, header)
    for name in ("exec", "read-file", "write-file"):
        assert statuses[f"{name} anonymous"] == 401
        assert statuses[f"{name} bad token"] == 401
        assert statuses[f"{name} GET"] == 405
        assert statuses[f"{name} anonymous GET"] == 401
        assert statuses[f"{name} unknown sandbox"] == 404
        assert statuses[f"{name} destroyed sandbox"] == 410
    assert statuses["exec malformed JSON"] == 400
    assert statuses["exec not an object"] == 400
    assert statuses["exec validation"] == 400
    assert statuses["read-file no path"] == 400
    assert statuses["read-file relative path"] == 400
    assert statuses["write-file media type"] == 415
    assert statuses["write-file relative path"] == 400
    assert statuses["write-file too large"] == 413


def test_the_token_exchange_is_served_directly_and_answers_what_django_answers(
    small_writes: LiveServer, enabled: Actor
) -> None:
    from accounts.api.asgi import TokenExchangeRoutes, token_exchange_view
    from config.asgi import application

    http = application.application_mapping["http"]
    assert any(isinstance(routes, TokenExchangeRoutes) for routes in http.app.routes)
    assert TokenExchangeRoutes().route("/api/v1/auth/token-exchange") == (token_exchange_view, {})
    assert TokenExchangeRoutes().route("/api/v1/auth/token-exchange/") is None

    path = "/api/v1/auth/token-exchange"
    form = "application/x-www-form-urlencoded"
    grant = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"
    jwt_type = "subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Ajwt"
    cases: list[tuple[str, str, bytes, str | None, int]] = [
        ("GET", "GET", b"", None, 405),
        ("JSON body", "POST", b"{}", "application/json", 400),
        ("wrong grant", "POST", b"grant_type=password", form, 400),
        ("no subject token", "POST", f"{grant}&{jwt_type}".encode(), form, 400),
        ("forged subject token", "POST", f"{grant}&{jwt_type}&subject_token=a.b.c".encode(), form, 400),
    ]
    for name, method, body, content_type, status in cases:
        expected = _django(None, method, path, body, content_type)
        got = _live(small_writes, None, method, path, body, content_type)
        assert got.status_code == expected.status_code == status, name
        assert got.json() == expected.json(), name
        for header in COMPARED_HEADERS:
            assert got.headers.get(header) == expected.headers.get(header), (name, header)


def test_creates_are_served_directly_and_answer_what_django_answers(small_writes: LiveServer, enabled: Actor) -> None:
    from accounts.models import Organization
    from accounts.services import create_token
    from config.asgi import application
    from sandboxes.api.asgi import create_view

    http = application.application_mapping["http"]
    routes = next(r for r in http.app.routes if isinstance(r, SandboxStreamRoutes))
    assert routes.route_request("POST", "/api/v1/sandboxes") == (create_view, {})
    # Listing, and every other method, stays with DRF.
    assert routes.route_request("GET", "/api/v1/sandboxes") is None
    assert routes.route_request("PUT", "/api/v1/sandboxes") is None
    assert routes.route_request("POST", "/api/v1/sandboxes/") is None

    path = "/api/v1/sandboxes"
    read_only = create_token(user=enabled.user, organization=enabled.organization, read_only=True).raw

    def compare(name: str, token: str | None, status: int, code: str | None) -> None:
        expected = _django(token, "POST", path, b"", None)
        got = _live(small_writes, token, "POST", path, b"", None)
        assert got.status_code == expected.status_code == status, name
        assert got.json() == expected.json(), name
        if code is not None:
            assert got.json()["error"]["code"] == code, name
        for header in COMPARED_HEADERS:
            assert got.headers.get(header) == expected.headers.get(header), (name, header)

    compare("anonymous", None, 401, "not_authenticated")
    compare("bad token", "svc_pat_nope", 401, "authentication_failed")
    compare("read-only token", read_only, 403, "read_only_token")
    Organization.objects.filter(pk=enabled.organization.pk).update(sandboxes_enabled=False)
    compare("not enabled", enabled.token, 403, "sandboxes_not_enabled")
    Organization.objects.filter(pk=enabled.organization.pk).update(sandboxes_enabled=True)
    for _ in range(10):
        Sandbox.objects.create(
            organization=enabled.organization,
            runtime="local",
            status=SandboxStatus.RUNNING,
            last_activity_at=timezone.now(),
        )
    compare("limit reached", enabled.token, 409, "sandbox_limit_reached")
    assert Sandbox.objects.count() == 10

    Sandbox.objects.all().delete()
    expected = _django(enabled.token, "POST", path, b"", None)
    got = _live(small_writes, enabled.token, "POST", path, b"", None)
    try:
        assert got.status_code == expected.status_code == 201
        assert set(got.json()) == set(expected.json())
        assert got.json()["status"] == expected.json()["status"] == "running"
        for header in COMPARED_HEADERS:
            assert got.headers.get(header) == expected.headers.get(header), ("created", header)
    finally:
        for created in (got, expected):
            if created.status_code == 201:
                get_runtime().destroy(created.json()["id"])


def test_a_create_served_directly_counts_against_the_tokens_rate_limit(
    transactional_db: Any, enabled: Actor, settings: Any
) -> None:
    server = start_live_server({"API_RATE_LIMIT": "2/min"})
    try:
        headers = {"Authorization": f"Bearer {enabled.token}"}
        # Two requests through DRF spend the budget the create (served from ASGI) shares with them.
        for _ in range(2):
            assert httpx.get(f"{server.url}/api/v1/me", headers=headers, timeout=30).status_code == 200
        refused = httpx.post(f"{server.url}/api/v1/sandboxes", headers=headers, timeout=30)
        assert refused.status_code == 429
        assert 0 < int(refused.headers["Retry-After"]) <= 60
        error = refused.json()["error"]
        assert error["code"] == "rate_limited" and error["details"]["retryAfterSeconds"] > 0
        assert not Sandbox.objects.exists()
    finally:
        stop_live_server(server)
