"""Rate limits: requests per token to the REST API, token exchanges per client address.

Counts live in the default cache (Redis when configured, shared by every process). Rates are read
from settings on each request, so an operator's change (and a test's override) applies without a
restart of anything but the setting's source.
"""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.http import HttpRequest
from rest_framework.throttling import SimpleRateThrottle

from accounts.models import hash_token
from common.auth import bearer_from_header


class _SettingsRate(SimpleRateThrottle):
    setting = ""

    def get_rate(self) -> str | None:
        return str(getattr(settings, self.setting, "")) or None


class TokenRateThrottle(_SettingsRate):
    """Per bearer token (its hash: the cache never holds a token); anonymous requests are 401 first."""

    scope = "token"
    setting = "API_RATE_LIMIT"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        raw = bearer_from_header(request.META.get("HTTP_AUTHORIZATION"))
        # DRF's anonymous user is None here (UNAUTHENTICATED_USER); a plain HttpRequest served
        # from ASGI (common.fastpath) reaches this only once its token was authenticated.
        if not raw or getattr(request, "user", True) is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": hash_token(raw)}


class TokenExchangeThrottle(_SettingsRate):
    """Per client address: the exchange is unauthenticated until the subject token is checked."""

    scope = "token_exchange"
    setting = "TOKEN_EXCHANGE_RATE_LIMIT"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def _allowed(throttle: SimpleRateThrottle, request: HttpRequest) -> tuple[bool, int | None]:
    # A plain Django request: the throttles here read nothing but request.META from it.
    if throttle.allow_request(cast(Any, request), cast(Any, None)):
        return True, None
    wait = throttle.wait()
    return False, int(wait) + 1 if wait is not None else None


def exchange_allowed(request: HttpRequest) -> tuple[bool, int | None]:
    """Whether one more token exchange from this address is allowed; if not, seconds to wait."""
    return _allowed(TokenExchangeThrottle(), request)


def api_request_allowed(request: HttpRequest) -> tuple[bool, int | None]:
    """Whether one more REST request with this (authenticated) token is allowed; if not, seconds to
    wait. For the REST views served from ASGI, which DRF's throttling does not see."""
    return _allowed(TokenRateThrottle(), request)
