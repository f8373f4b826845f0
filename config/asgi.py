"""ASGI entry point: one application for HTTP and WebSocket (served by uvicorn in `make run`)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Django must be set up before anything imports models (the routing modules below do).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from accounts.api.asgi import TokenExchangeRoutes  # noqa: E402
from common.ws_auth import BearerTokenWebSocketMiddleware  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from sandboxes.api.asgi import SandboxStreamRoutes  # noqa: E402
from toolapi.asgi import WithToolHttpApi  # noqa: E402
from toolapi.mcp_endpoint import WithMcpEndpoint  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /api/mcp is the MCP SDK's own ASGI app (the aggregated tool endpoint); the tool HTTP API's
        # routes, the sandbox streams (exec, read-file, write-file) and the token exchange are served
        # in front of Django's middleware stack (common/fastpath.py); the rest is Django.
        "http": WithMcpEndpoint(WithToolHttpApi(django_asgi_app, also=[SandboxStreamRoutes(), TokenExchangeRoutes()])),
        "websocket": BearerTokenWebSocketMiddleware(URLRouter(websocket_urlpatterns)),
    }
)
