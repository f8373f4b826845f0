"""ASGI entry point: one application for HTTP and WebSocket (served by uvicorn in `make run`)."""

from __future__ import annotations

import os

import django
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class _ASGIHandler(ASGIHandler):
    # Django cuts every part of a streamed body into 64 KiB messages (a copy and an ASGI send
    # each). File and exec streams produce parts of up to 1 MiB on purpose, and cutting them up
    # cost read-file a good part of its throughput: parts up to this size go out whole.
    chunk_size = 1024 * 1024


# Django must be set up before anything imports models (the routing modules below do); this is
# what get_asgi_application() does, with the handler above.
django.setup(set_prefix=False)
django_asgi_app = _ASGIHandler()

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
