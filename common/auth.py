"""Bearer-token authentication, shared by DRF views, plain async views and WebSocket consumers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.models import ApiToken, Membership, User, hash_token
from common.errors import ApiError
from common.principal import Principal
from common.ttlcache import TtlCache

# last_used_at is informational; writing it on every request would turn every read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class InvalidToken(Exception):  # noqa: N818 - reads as a condition, like Http404
    pass


def principal_from_raw_token(raw: str) -> Principal:
    """Resolve a raw bearer token to a Principal or raise InvalidToken (always the same message)."""
    if not raw:
        raise InvalidToken
    token = ApiToken.objects.select_related("user", "organization").filter(token_hash=hash_token(raw)).first()
    if token is None or not token.is_active or not token.user.is_active:
        raise InvalidToken
    membership = Membership.objects.filter(user=token.user, organization=token.organization).only("role").first()
    if membership is None:
        raise InvalidToken
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return Principal(
        user=token.user,
        organization=token.organization,
        role=membership.role,
        token=token,
        read_only=token.read_only,
        sandbox_id=token.sandbox_id,
    )


def bearer_from_header(value: str | None) -> str | None:
    """The token in an ``Authorization: Bearer`` header, '' for a malformed one, None when absent."""
    if not value:
        return None
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return credentials.strip()


def principal_for_request(request: HttpRequest) -> Principal:
    """For views outside DRF (streaming async views): raise ApiError 401 unless a valid bearer is sent."""
    return _principal_for_request(request, principal_from_raw_token)


def _principal_for_request(request: HttpRequest, resolve: Callable[[str], Principal]) -> Principal:
    raw = bearer_from_header(request.headers.get("Authorization"))
    if raw is None:
        raise ApiError(
            status_code=401, code="not_authenticated", message="Authentication credentials were not provided."
        )
    try:
        return resolve(raw)
    except InvalidToken:
        raise ApiError(status_code=401, code="authentication_failed", message="Invalid or expired token.") from None


aprincipal_for_request = sync_to_async(principal_for_request)


# -- a short-lived cache for the hottest callers ---------------------------------------------------
#
# Tool calls authenticate every request, and two queries per call are most of a proxied call's own
# cost. Callers that opt in (the tool HTTP API and the MCP endpoint) keep a resolved principal for
# PRINCIPAL_CACHE_SECONDS. Revoking a token through accounts.services drops this process's entries at
# once; anything else (a revocation made by another process, a deactivated user, a removed
# membership, a changed role) takes effect within the bound. A token's own expiry is checked on every
# hit, so expiring is exact. Invalid tokens are never cached.

DEFAULT_PRINCIPAL_CACHE_SECONDS = 2.0


def _principal_ttl() -> float:
    return float(getattr(settings, "PRINCIPAL_CACHE_SECONDS", DEFAULT_PRINCIPAL_CACHE_SECONDS))


def _token_still_active(principal: Principal) -> bool:
    return principal.token is None or principal.token.is_active


_principals: TtlCache[str, Principal] = TtlCache(_principal_ttl, valid=_token_still_active)


def cached_principal(raw: str) -> Principal | None:
    """The principal of ``raw`` if this process resolved it recently; never touches the database."""
    if not raw:
        return None
    return _principals.get(hash_token(raw))


def principal_from_raw_token_cached(raw: str) -> Principal:
    """principal_from_raw_token, answered from the short-lived cache when possible (see above)."""
    if not raw:
        raise InvalidToken
    key = hash_token(raw)
    found = _principals.get(key)
    if found is not None:
        return found
    generation = _principals.generation
    principal = principal_from_raw_token(raw)
    _principals.put(key, principal, generation)
    return principal


def principal_for_request_cached(request: HttpRequest) -> Principal:
    """principal_for_request (same rule, same 401s) through the short-lived cache."""
    return _principal_for_request(request, principal_from_raw_token_cached)


def forget_cached_principals(token_hashes: Iterable[str] | None = None) -> None:
    """Drop the cached principals of these tokens (by hash; every one when None), in this process.

    Either way, a lookup already under way when this is called stores nothing (it may have read a
    token just revoked)."""
    if token_hashes is None:
        _principals.forget()
        return
    for token_hash in token_hashes:
        _principals.discard(token_hash)
    _principals.invalidate_pending()


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[User, Principal] | None:
        raw = bearer_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if raw is None:
            return None
        try:
            principal = principal_from_raw_token(raw)
        except InvalidToken:
            raise exceptions.AuthenticationFailed("Invalid or expired token.") from None
        return principal.user, principal

    def authenticate_header(self, request: Request) -> str:
        # Without this DRF would answer 403 instead of 401 for a missing token.
        return 'Bearer realm="api"'


def get_principal(request: Any) -> Principal:
    principal = getattr(request, "auth", None)
    if not isinstance(principal, Principal):
        raise exceptions.NotAuthenticated()
    return principal
