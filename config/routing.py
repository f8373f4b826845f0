"""WebSocket routes. Apps that serve WebSockets add their patterns here."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
