"""The HTTP/1.1 protocol the service is served with: uvicorn's, plus two zero-copy extensions.

``uvicorn --http common.http_server:HttpProtocol`` (as ``make run`` starts it). Everything is
uvicorn's httptools protocol, except that requests on a plain (not TLS) connection carry
(common.zerocopy):

- ``scope["extensions"]["svc.body_socket"]`` when their body has a ``Content-Length``: a view that
  wants the body in a file can take the rest of it straight from the socket instead of through
  ``receive``;
- ``scope["extensions"]["svc.send_file"]``: a view can send (part of) its response body from an
  open file with ``sendfile(2)`` instead of through ``send``.

Taking a body over: reading from the socket is paused (the server reads no more of it), what the
server had already read is handed over, ``receive`` will report no more body, and the connection
is closed after the response (the parser never saw the rest of the body, so it cannot find the
next request). Whatever arrives after the body is ignored.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl

from common import zerocopy
from common.zerocopy import BODY_SOCKET, SEND_FILE, ClientGoneError

# For `--http`: this module's protocol, by import path.
PROTOCOL = "common.http_server:HttpProtocol"


def _cut_off(protocol: HttpProtocol, cycle: RequestResponseCycle) -> None:
    """End a request whose body could not go through: nobody to answer, and the connection unusable."""
    cycle.disconnected = True
    cycle.message_event.set()
    protocol.transport.close()


class _TakenBody:
    def __init__(self, handle: _BodySocket, fd: int, pending: bytes, remaining: int) -> None:
        self._handle = handle
        self.fd = fd
        self.pending = pending
        self.remaining = remaining
        self._released = False

    def release(self, *, aborted: bool) -> None:
        if self._released:
            return
        self._released = True
        os.close(self.fd)
        protocol = self._handle.protocol
        if aborted:
            _cut_off(protocol, self._handle.cycle)
        elif not protocol.transport.is_closing():
            # Reading again takes in (and drops, see data_received) whatever the client sent after
            # the body, and notices a disconnect. Closing a socket with unread bytes in it resets
            # the connection, and the client could lose the answer to its upload.
            protocol.flow.resume_reading()


class _BodySocket:
    """One request's extension (see common.zerocopy.BodySocket)."""

    def __init__(self, protocol: HttpProtocol, cycle: RequestResponseCycle, length: int) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.length = length
        self.delivered = 0  # body bytes the parser passed on (to cycle.body)
        self.taken = False

    def take(self, min_remaining: int) -> _TakenBody | None:
        protocol, cycle = self.protocol, self.cycle
        remaining = self.length - self.delivered
        if (
            self.taken
            or protocol.cycle is not cycle
            or not cycle.more_body
            or cycle.disconnected
            or cycle.response_started
            or protocol.transport.is_closing()
            or remaining < max(min_remaining, 1)
        ):
            return None
        sock = protocol.transport.get_extra_info("socket")
        if sock is None:
            return None
        fd = os.dup(sock.fileno())
        if cycle.waiting_for_100_continue:
            # What receive() would have sent before the first read of the body.
            protocol.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        protocol.flow.pause_reading()
        self.taken = True
        pending = bytes(cycle.body)
        cycle.body = bytearray()
        cycle.more_body = False
        # Set by the body read so far; receive() now waits for a disconnect only.
        cycle.message_event.clear()
        cycle.keep_alive = False
        return _TakenBody(self, fd, pending, remaining)


class _FileSender:
    """One request's ``svc.send_file`` (see common.zerocopy.FileSender)."""

    def __init__(self, protocol: HttpProtocol, cycle: RequestResponseCycle, stall_seconds: float) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.stall_seconds = stall_seconds
        self.sent = 0

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        protocol, cycle = self.protocol, self.cycle
        if cycle.disconnected or protocol.cycle is not cycle:
            raise ClientGoneError("the client went away")
        if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding:
            raise RuntimeError("send_file needs a started response with a Content-Length")
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        transport = protocol.transport
        # What was written before (the head) goes out first: the file's bytes go to the socket itself.
        while transport.get_write_buffer_size():
            if transport.is_closing():
                raise ClientGoneError("the client went away")
            await asyncio.sleep(0.001)
        sock = transport.get_extra_info("socket")
        sock_fd = os.dup(sock.fileno())
        progress = [0]
        try:
            sent = await zerocopy.in_thread(
                functools.partial(
                    zerocopy.send_file, sock_fd, fd, offset, count, progress=progress, stall_seconds=self.stall_seconds
                )
            )
        except BaseException:
            # Gone, stalled or cancelled: the body is cut short, and the connection with it.
            self.sent += progress[0]
            _cut_off(protocol, cycle)
            raise
        finally:
            os.close(sock_fd)
        self.sent += sent
        cycle.expected_content_length -= sent
        if sent < count:
            _cut_off(protocol, cycle)  # the file shrank: the promised length cannot be sent
        return sent


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    lengths = [value for name, value in headers if name == b"content-length"]
    if len(lengths) != 1 or not lengths[0].isdigit() or any(name == b"transfer-encoding" for name, _ in headers):
        return None
    return int(lengths[0])


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, offering each request's body socket and file sender (see the module doc)."""

    _body_socket: _BodySocket | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_socket = None

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle: Any = self.cycle
        # No new cycle for an upgrade (WebSocket); a cycle of its own for anything else.
        if cycle is None or cycle.scope is not self.scope or is_ssl(self.transport):
            return
        extensions = self.scope.setdefault("extensions", {})
        extensions[SEND_FILE] = _FileSender(self, cycle, settings.FILE_TRANSFER_STALL_SECONDS)
        length = _content_length(self.headers)
        if length:
            self._body_socket = _BodySocket(self, cycle, length)
            extensions[BODY_SOCKET] = self._body_socket

    def data_received(self, data: bytes) -> None:
        handle = self._body_socket
        if handle is not None and handle.taken:
            return  # past a taken body: the connection closes after the response
        super().data_received(data)

    def on_body(self, body: bytes) -> None:
        handle = self._body_socket
        if handle is not None and handle.cycle is self.cycle and not self.cycle.response_complete:
            handle.delivered += len(body)
        super().on_body(body)
