"""The short-lived principal cache the tool API authenticates through (common.auth)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, hash_token
from common import auth
from common.auth import (
    DEFAULT_PRINCIPAL_CACHE_SECONDS,
    InvalidToken,
    cached_principal,
    forget_cached_principals,
    principal_from_raw_token_cached,
)
from tests.conftest import Actor

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    forget_cached_principals()
    yield
    forget_cached_principals()


def _token(actor: Actor) -> ApiToken:
    return ApiToken.objects.get(token_hash=hash_token(actor.token))


def test_the_documented_bound() -> None:
    assert DEFAULT_PRINCIPAL_CACHE_SECONDS == 2.0


def test_a_resolved_principal_is_served_without_queries(owner: Actor, django_assert_num_queries: Any) -> None:
    assert cached_principal(owner.token) is None
    principal = principal_from_raw_token_cached(owner.token)
    assert principal.user == owner.user
    assert principal.organization == owner.organization
    with django_assert_num_queries(0):
        assert principal_from_raw_token_cached(owner.token) is principal
        assert cached_principal(owner.token) is principal


def test_invalid_tokens_are_never_cached(db: Any) -> None:
    for raw in ("svc_pat_nope", ""):
        with pytest.raises(InvalidToken):
            principal_from_raw_token_cached(raw)
        assert cached_principal(raw) is None


def test_revoking_a_token_takes_effect_at_once(owner: Actor) -> None:
    principal_from_raw_token_cached(owner.token)
    services.revoke_token(token=_token(owner))
    assert cached_principal(owner.token) is None
    with pytest.raises(InvalidToken):
        principal_from_raw_token_cached(owner.token)


def test_revoking_a_sandboxs_tokens_takes_effect_at_once(owner: Actor) -> None:
    issued = services.issue_sandbox_token(user=owner.user, organization=owner.organization, sandbox_id="sbx_cache")
    assert principal_from_raw_token_cached(issued.raw).read_only is True
    assert services.revoke_sandbox_tokens(sandbox_id="sbx_cache") == 1
    with pytest.raises(InvalidToken):
        principal_from_raw_token_cached(issued.raw)


def test_a_revocation_keeps_every_other_tokens_principal(owner: Actor, teammate: Actor) -> None:
    # Every sandbox destroy revokes the sandbox's own tokens; its owner's next request must not pay
    # for a fresh lookup because of it.
    issued = services.issue_sandbox_token(user=owner.user, organization=owner.organization, sandbox_id="sbx_other")
    kept = [principal_from_raw_token_cached(raw) for raw in (owner.token, teammate.token)]
    principal_from_raw_token_cached(issued.raw)
    services.revoke_sandbox_tokens(sandbox_id="sbx_other")
    assert cached_principal(issued.raw) is None
    assert [cached_principal(owner.token), cached_principal(teammate.token)] == kept
    services.revoke_token(token=_token(teammate))
    assert cached_principal(teammate.token) is None
    assert cached_principal(owner.token) is kept[0]


def test_a_lookup_that_raced_a_targeted_revocation_is_not_kept(owner: Actor, monkeypatch: pytest.MonkeyPatch) -> None:
    original = auth.principal_from_raw_token

    def revoked_meanwhile(raw: str) -> Any:
        principal = original(raw)
        forget_cached_principals([hash_token(raw)])
        return principal

    monkeypatch.setattr(auth, "principal_from_raw_token", revoked_meanwhile)
    principal_from_raw_token_cached(owner.token)
    assert cached_principal(owner.token) is None


def test_changes_made_elsewhere_take_effect_within_the_bound(owner: Actor, settings: Any) -> None:
    settings.PRINCIPAL_CACHE_SECONDS = 0.3
    principal_from_raw_token_cached(owner.token)
    # A revocation by another process (or straight in the database) cannot reach this cache ...
    ApiToken.objects.filter(pk=_token(owner).pk).update(revoked_at=timezone.now())
    assert principal_from_raw_token_cached(owner.token).user == owner.user
    # ... and is honoured once the entry is older than the bound.
    time.sleep(0.35)
    with pytest.raises(InvalidToken):
        principal_from_raw_token_cached(owner.token)


def test_expiry_is_exact_for_cached_tokens(owner: Actor) -> None:
    issued = services.create_token(
        user=owner.user, organization=owner.organization, expires_at=timezone.now() + timedelta(seconds=0.3)
    )
    principal_from_raw_token_cached(issued.raw)
    assert cached_principal(issued.raw) is not None
    time.sleep(0.35)
    assert cached_principal(issued.raw) is None
    with pytest.raises(InvalidToken):
        principal_from_raw_token_cached(issued.raw)


def test_a_lookup_that_raced_a_revocation_is_not_kept(owner: Actor, monkeypatch: pytest.MonkeyPatch) -> None:
    original = auth.principal_from_raw_token

    def revoked_meanwhile(raw: str) -> Any:
        principal = original(raw)
        forget_cached_principals()  # a revocation committed while this lookup was reading
        return principal

    monkeypatch.setattr(auth, "principal_from_raw_token", revoked_meanwhile)
    principal_from_raw_token_cached(owner.token)
    assert cached_principal(owner.token) is None


def test_a_zero_bound_disables_the_cache(owner: Actor, settings: Any) -> None:
    settings.PRINCIPAL_CACHE_SECONDS = 0
    principal_from_raw_token_cached(owner.token)
    assert cached_principal(owner.token) is None
