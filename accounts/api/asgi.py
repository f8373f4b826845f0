"""The token exchange served straight from ASGI (common.fastpath).

Every sandbox start waits for its exchange, and Django's sync middleware stack (sessions, auth,
CSRF, messages: none of which the exchange uses; it is CSRF-exempt and authenticates by its subject
token) cost more than the exchange itself. The view is the same function, run in a worker thread.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase

from accounts.api import token_exchange
from common.fastpath import Routes, View
from common.middleware import jsonify_error

PATH = "/api/v1/auth/token-exchange"


def _exchange(request: HttpRequest) -> HttpResponseBase:
    # Outside Django's request cycle nothing else releases the thread's connection when it is stale.
    close_old_connections()
    try:
        return token_exchange.token_exchange(request)
    finally:
        close_old_connections()


_aexchange = sync_to_async(_exchange, thread_sensitive=False)


async def token_exchange_view(request: HttpRequest) -> HttpResponseBase:
    # require_POST's 405 is not JSON; under Django, ApiErrorMiddleware makes it so.
    return jsonify_error(request, await _aexchange(request))


class TokenExchangeRoutes(Routes):
    name = "token exchange"

    def route(self, path_info: str) -> tuple[View, dict[str, str]] | None:
        return (token_exchange_view, {}) if path_info == PATH else None
