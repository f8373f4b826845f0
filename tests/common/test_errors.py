"""The JSON error shape on /api/ for every kind of failure, and no HTML."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import Actor

pytestmark = pytest.mark.django_db


def _assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code


def test_unknown_api_url_is_json_404(owner: Actor) -> None:
    _assert_error(owner.client().get("/api/v1/does-not-exist"), 404, "not_found")
    _assert_error(Client().get("/api/nothing"), 404, "not_found")


def test_malformed_json_is_400(owner: Actor) -> None:
    response = owner.client().patch("/api/v1/organization", "{not json", content_type="application/json")
    _assert_error(response, 400, "malformed_request")


def test_wrong_method_is_405(owner: Actor) -> None:
    _assert_error(owner.client().delete("/api/v1/me"), 405, "method_not_allowed")


def test_wrong_media_type_is_415(owner: Actor) -> None:
    response = owner.client().patch("/api/v1/organization", "name=x", content_type="text/plain")
    _assert_error(response, 415, "unsupported_media_type")


def test_oversized_body_is_413(owner: Actor, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = owner.client().patch("/api/v1/organization", {"name": "x" * 5000}, content_type="application/json")
    _assert_error(response, 413, "payload_too_large")


def test_healthz_reports_checks() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["broker"]["ok"] is True


def test_healthz_is_503_when_a_dependency_is_down(settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"]["ok"] is False
