"""WebSocket authentication: a bearer token in the Authorization header, never in the query string.

No WebSocket endpoint is served yet (the web terminal brings the first); the middleware every one
will sit behind is exercised here through Channels' own test communicator, with a consumer that
reports what the middleware put in its scope.
"""

from __future__ import annotations

from typing import Any

import pytest
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.testing import WebsocketCommunicator

from common.ws_auth import BearerTokenWebSocketMiddleware
from tests.conftest import Actor

pytestmark = pytest.mark.django_db(transaction=True)


class _Whoami(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        if self.scope["bearer_rejected"]:
            await self.close(code=4401)
            return
        await self.accept()
        principal = self.scope["principal"]
        await self.send_json({"organization": principal.organization.slug if principal else None})


async def _connect(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[bool, Any, WebsocketCommunicator]:
    communicator = WebsocketCommunicator(BearerTokenWebSocketMiddleware(_Whoami.as_asgi()), path, headers=headers)
    connected, code = await communicator.connect()
    return connected, code, communicator


async def test_header_token_identifies_the_caller(owner: Actor) -> None:
    connected, _, communicator = await _connect("/ws/x", [(b"authorization", f"Bearer {owner.token}".encode())])
    assert connected
    assert await communicator.receive_json_from() == {"organization": owner.organization.slug}
    await communicator.disconnect()


async def test_query_string_token_is_ignored(owner: Actor) -> None:
    connected, _, communicator = await _connect(f"/ws/x?token={owner.token}", [])
    assert connected
    assert await communicator.receive_json_from() == {"organization": None}
    await communicator.disconnect()


async def test_bad_token_is_refused() -> None:
    connected, code, _ = await _connect("/ws/x", [(b"authorization", b"Bearer svc_pat_not-a-real-token")])
    assert not connected and code == 4401
