"""WebSocket authentication: a bearer token in the Authorization header, or the dashboard session.

Tokens are never accepted in the query string: URLs end up in proxy and access logs.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

from common.auth import InvalidToken, bearer_from_header, principal_from_raw_token
from common.principal import Principal


@database_sync_to_async
def _principal(raw: str) -> Principal | None:
    try:
        return principal_from_raw_token(raw)
    except InvalidToken:
        return None


class _BearerMiddleware(BaseMiddleware):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        raw = bearer_from_header(headers.get("authorization"))
        scope = dict(scope)
        scope["principal"] = None
        scope["bearer_rejected"] = False
        if raw is not None:
            principal = await _principal(raw)
            scope["principal"] = principal
            scope["bearer_rejected"] = principal is None
        return await super().__call__(scope, receive, send)


def BearerTokenWebSocketMiddleware(inner: Any) -> Any:  # noqa: N802 - reads like the class it wraps
    """Session auth (for the dashboard's browser, which cannot set headers) under bearer auth."""
    return AuthMiddlewareStack(_BearerMiddleware(inner))
