"""Rate limits answer 429 with Retry-After and the JSON error body, per token and per address."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from tests.conftest import Actor


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    cache.clear()


@pytest.mark.django_db
def test_each_token_has_its_own_request_budget(settings: Any, owner: Actor, teammate: Actor) -> None:
    settings.API_RATE_LIMIT = "3/min"
    client = Client()
    for _ in range(3):
        assert client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {owner.token}").status_code == 200
    refused = client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "rate_limited" and error["details"]["retryAfterSeconds"] > 0
    # Another person's token is unaffected.
    assert client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {teammate.token}").status_code == 200


@pytest.mark.django_db
def test_an_empty_rate_turns_the_limit_off(settings: Any, owner: Actor) -> None:
    settings.API_RATE_LIMIT = ""
    client = Client()
    statuses = [client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {owner.token}").status_code for _ in range(20)]
    assert statuses == [200] * 20


@pytest.mark.django_db
def test_token_exchanges_are_limited_per_address(settings: Any) -> None:
    settings.TOKEN_EXCHANGE_RATE_LIMIT = "2/min"
    form = {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token": "not-a-jwt",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
    }
    here = Client(REMOTE_ADDR="10.1.1.1")
    assert [here.post("/api/v1/auth/token-exchange", form).status_code for _ in range(2)] == [400, 400]
    refused = here.post("/api/v1/auth/token-exchange", form)
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
    assert int(refused["Retry-After"]) > 0
    assert Client(REMOTE_ADDR="10.2.2.2").post("/api/v1/auth/token-exchange", form).status_code == 400
