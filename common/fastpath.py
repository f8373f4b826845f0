"""Async API views served straight from ASGI, in front of Django's request cycle.

For a request that does a few milliseconds of real work, most of its latency under Django's async
handler goes to the cycle around the view: every sync-only middleware in the stack (WhiteNoise,
sessions, CSRF, messages, ...) and every MiddlewareMixin hook runs through a thread hop, and the
request_started/request_finished signals add more. Here the same async views run for the same URLs
with exactly the same request and response objects, and the middleware is accounted for one by one:

- header-only middleware (security headers, X-Frame-Options, host validation, CommonMiddleware's
  Content-Length) runs inline, in settings order, without a thread hop;
- middleware with no effect on these views is skipped, with the reason listed in ``_NO_EFFECT``;
- an exception from a view goes through ApiErrorMiddleware.process_exception, as under Django.

Any middleware not listed here disables the fast path (every request goes to Django, with a
warning), so adding one to settings.MIDDLEWARE can never be silently bypassed. A request whose
header checks would not pass (a disallowed host, an SSL redirect, ...) is handed to Django untouched,
which answers it as before. Request construction, disconnect handling and response sending are
Django's own ASGIHandler methods.

Bodies: Django reads a whole request body (spooling it to disk past a few megabytes) before the view
runs. A view marked with ``streams_body`` instead gets the body as it arrives (``body_chunks``), so a
1 GiB upload is relayed with bounded memory and no temporary file, and a view can refuse it (413)
without waiting for all of it.

Which URLs are served here, and what a request needs around its view, is each area's own
(``Routes``): views served here run outside Django's request cycle, so whatever they rely on from
that cycle (releasing a database connection, say) they do themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

from common import zerocopy
from common.errors import error_response
from common.middleware import ApiErrorMiddleware

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
View = Callable[..., Awaitable[HttpResponseBase]]

# Pure functions of the request's headers and the response: run inline, in settings order.
_INLINE = (
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
# Middleware that cannot change the requests or responses of views served here, and why.
_NO_EFFECT = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves STATIC_URL only",
    "django.contrib.sessions.middleware.SessionMiddleware": "the views never read or write the session",
    "django.middleware.csrf.CsrfViewMiddleware": "the views are csrf_exempt and never use the CSRF token",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "the views authenticate bearer tokens only",
    "django.contrib.messages.middleware.MessageMiddleware": "the views add no messages",
    # Its process_exception is applied below; its response hook only rewrites non-JSON error
    # responses, and these views answer every error in JSON.
    "common.middleware.ApiErrorMiddleware": "exceptions are passed to its process_exception",
}


_ViewT = TypeVar("_ViewT", bound=Callable[..., Any])


def streams_body(view: _ViewT) -> _ViewT:
    """Mark a view that reads its body with ``body_chunks`` as it arrives (see the module doc)."""
    view.streams_body = True  # type: ignore[attr-defined]
    return view


class BodyStream:
    """A request body read from ASGI ``receive`` chunk by chunk, or spliced into a file, once."""

    def __init__(self, receive: Receive, body_socket: zerocopy.BodySocket | None = None) -> None:
        self._receive = receive
        self._body_socket = body_socket
        # Set once the body has been read to its end (or refused): only then may anything else
        # (the disconnect listener) call receive.
        self.finished = asyncio.Event()

    async def splice_into(self, fd: int) -> int | None:
        """Write the body into the file ``fd`` by splicing it from the client's socket, where the
        server offers that and enough of it is still to come (common.zerocopy); the bytes
        written. None: nothing was read, use ``chunks``."""
        if self._body_socket is None or self.finished.is_set() or not zerocopy.can_transfer():
            return None
        taken = self._body_socket.take(zerocopy.MIN_SPLICE_BYTES)
        if taken is None:
            return None
        try:
            return await zerocopy.splice_into(taken, fd, stall_seconds=settings.FILE_TRANSFER_STALL_SECONDS)
        except zerocopy.ClientGoneError as exc:
            raise RequestAborted() from exc
        finally:
            self.finished.set()

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.finished.is_set():
            return
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise RequestAborted()
                body = message.get("body", b"")
                more = message.get("more_body", False)
                if body:
                    yield body
                if not more:
                    return
        finally:
            self.finished.set()


async def body_chunks(request: HttpRequest, chunk_size: int) -> AsyncIterator[bytes]:
    """The request body as it arrives when served here; otherwise read from Django's spooled body."""
    stream: BodyStream | None = getattr(request, "body_stream", None)
    if stream is not None:
        async for chunk in stream.chunks():
            yield chunk
        return
    while chunk := request.read(chunk_size):
        yield chunk


async def splice_body_into(request: HttpRequest, fd: int) -> int | None:
    """``BodyStream.splice_into`` for a request served here; None elsewhere (use ``body_chunks``)."""
    stream: BodyStream | None = getattr(request, "body_stream", None)
    return None if stream is None else await stream.splice_into(fd)


class FileDescriptorResponse(StreamingHttpResponse):
    """A streamed response whose body is the first ``size`` bytes of the open file ``fd``.

    Served here by a server that offers it (common.zerocopy.SEND_FILE), the kernel sends the file
    (``sendfile``) and ``finished(sent, complete)`` is awaited afterwards, whatever happened; the
    streamed content is then never iterated. Anywhere else it is an ordinary streamed response, and
    its content does that work.
    """

    def __init__(
        self,
        streaming_content: AsyncIterator[bytes],
        *,
        fd: int,
        size: int,
        finished: Callable[[int, bool], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(streaming_content, **kwargs)
        self.fd = fd
        self.size = size
        self.finished = finished
        self["Content-Length"] = str(size)


def _start_message(response: HttpResponseBase) -> dict[str, Any]:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]
    headers += [
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip()) for cookie in response.cookies.values()
    ]
    return {"type": "http.response.start", "status": response.status_code, "headers": headers}


async def _send_streaming_response(response: StreamingHttpResponse, send: Send) -> None:
    """A streamed response, each part of its content one message.

    Django's ASGI handler cuts every part into messages of at most its ``chunk_size`` (1 MiB here,
    config/asgi.py), each a copy: an exec's coalesced output (a mebibyte of data, one NDJSON line)
    is a little longer than that, and was copied and sent in two. Parts are sent whole here; the
    views that stream already bound their size.
    """
    await send(_start_message(response))
    content = aiter(response)
    try:
        async for part in content:
            if part:
                await send({"type": "http.response.body", "body": bytes(part), "more_body": True})
    finally:
        # Closed at once, as Django's own sending does: a stream given up midway ends its work now,
        # not when it is collected.
        aclose = getattr(content, "aclose", None)
        if aclose is not None:
            await aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_file_response(response: FileDescriptorResponse, sender: zerocopy.FileSender, send: Send) -> None:
    complete = False
    try:
        await send(_start_message(response))
        if response.size:
            await sender.send_file(response.fd, 0, response.size)
        complete = sender.sent == response.size
        if complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except zerocopy.ClientGoneError:
        pass  # the server closed the connection; nobody to answer
    finally:
        await response.finished(sender.sent, complete)


class Routes:
    """One area's views served here. Subclasses give ``route`` and, where needed, the hooks."""

    name = "API"

    def route(self, path_info: str) -> tuple[View, dict[str, str]] | None:
        """The view and arguments Django's URLconf gives ``path_info``, for this area's routes only."""
        raise NotImplementedError

    def route_request(self, method: str, path_info: str) -> tuple[View, dict[str, str]] | None:
        """``route``, for areas that serve only some methods of a URL here (the rest go to Django)."""
        return self.route(path_info)

    def started(self) -> None:
        """Called once per request served here, before its body is read."""

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Context around the view and the sending of its response."""
        yield

    def finished(self, response: HttpResponseBase) -> None:
        """Called once the whole response was sent (not when the client went away first)."""


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` as if the request body had not been read yet."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


class _JoinedEnd:
    """An ASGI ``send`` that sends a stream's last part and its end together.

    Django ends every streamed body with an empty message of its own, and the server writes each
    message to the socket: for a short stream (an exec of `true` is one line) that is one more
    write, and one more wake-up of the client, than the content needs. A body part is held until
    the current turn of the event loop is over: if the end comes within it, both go out as one
    message; if not, the part goes out then, on its own, so streaming is never delayed.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self._held: dict[str, Any] | None = None
        self._flushing: asyncio.Task[None] | None = None

    async def __call__(self, message: Mapping[str, Any]) -> None:
        if self._flushing is not None:
            flushing, self._flushing = self._flushing, None
            await flushing
        held, self._held = self._held, None
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if held is not None:
            if not message.get("more_body", False):
                await self._send({**message, "body": held["body"] + message.get("body", b"")})
                return
            await self._send(held)
        if message.get("more_body", False):
            self._held = dict(message)
            asyncio.get_running_loop().call_soon(self._flush_soon)
        else:
            await self._send(message)

    def _flush_soon(self) -> None:
        if self._held is not None and self._flushing is None:
            held, self._held = self._held, None
            self._flushing = asyncio.ensure_future(self._send(held))
            # Its failure reaches the next send; a response abandoned before one (the client went
            # away) must not leave it unretrieved, to be logged as an error at collection.
            self._flushing.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _unused_get_response(request: HttpRequest) -> HttpResponseBase:  # pragma: no cover - never called
    raise AssertionError("middleware hooks are called directly")


class DirectAsgi:
    """Serves the routes of ``routes`` from ASGI and everything else through ``app`` (Django)."""

    def __init__(self, app: ASGIHandler, routes: Sequence[Routes]) -> None:
        self.app = app
        self.routes = list(routes)
        self.inline: list[Any] = []
        self.errors = ApiErrorMiddleware(_unused_get_response)
        unknown = [path for path in settings.MIDDLEWARE if path not in _INLINE and path not in _NO_EFFECT]
        self.enabled = not unknown
        if unknown:
            names = ", ".join(routes.name for routes in self.routes)
            logger.warning("%s served through Django: unaccounted middleware %s", names, ", ".join(unknown))
        else:
            self.inline = [import_string(path)(_unused_get_response) for path in settings.MIDDLEWARE if path in _INLINE]

    def find(self, path_info: str, method: str = "GET") -> tuple[Routes, View, dict[str, str]] | None:
        for routes in self.routes:
            found = routes.route_request(method, path_info)
            if found is not None:
                return routes, *found
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope.get("type") == "http":
            prefix = get_script_prefix(scope)
            path = scope["path"]
            found = self.find(path.removeprefix(prefix) if prefix else path, scope.get("method", "GET"))
            if found is not None:
                await self._serve(scope, receive, send, *found)
                return
        await self.app(scope, receive, send)

    def _passes_header_checks(self, request: HttpRequest) -> bool:
        """Whether the request-side middleware would let the request through to the view."""
        try:
            return all(
                middleware.process_request(request) is None
                for middleware in self.inline
                if hasattr(middleware, "process_request")
            )
        except Exception:
            return False

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, routes: Routes, view: View, kwargs: dict[str, str]
    ) -> None:
        # The same steps as ASGIHandler.handle, minus URL resolving, the middleware chain and signals.
        routes.started()
        stream = None
        if getattr(view, "streams_body", False):
            stream = BodyStream(receive, scope.get("extensions", {}).get(zerocopy.BODY_SOCKET))
        if stream is not None:
            body_file: Any = io.BytesIO()
        else:
            try:
                body_file = await self.app.read_body(receive)
            except RequestAborted:
                return
        set_script_prefix(get_script_prefix(scope))
        request, _error = self.app.create_request(scope, body_file)
        if request is not None and stream is not None:
            request.body_stream = stream  # type: ignore[attr-defined]
        if request is None or not self._passes_header_checks(request):
            # A redirect, DisallowedHost, a forbidden user agent, undecodable input: Django answers it
            # exactly as it would any other request, given the body it already sent.
            body_file.seek(0)
            body = body_file.read()
            body_file.close()
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            with routes.serving():
                response = await self._respond_until_disconnect(request, receive, send, view, kwargs, stream)
        finally:
            body_file.close()
        if response is not None:
            routes.finished(response)

    async def _respond_until_disconnect(
        self,
        request: HttpRequest,
        receive: Receive,
        send: Send,
        view: View,
        kwargs: dict[str, str],
        stream: BodyStream | None = None,
    ) -> HttpResponseBase | None:
        async def listen() -> None:
            if stream is not None:
                # The view owns receive until it has read the body (a disconnect meanwhile reaches
                # it as RequestAborted); a response that never reads it ends before this wakes.
                await stream.finished.wait()
            await self.app.listen_for_disconnect(receive)

        async def respond() -> HttpResponseBase:
            response = await self._response(request, view, kwargs)
            sender = request.scope.get("extensions", {}).get(zerocopy.SEND_FILE)  # type: ignore[attr-defined]
            try:
                if isinstance(response, FileDescriptorResponse) and sender is not None and zerocopy.can_transfer():
                    await _send_file_response(response, sender, send)
                elif isinstance(response, StreamingHttpResponse):
                    await _send_streaming_response(response, _JoinedEnd(send))
                else:
                    await self.app.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while the response was being sent
            return response

        # A client that disconnects cancels the view (and with it its work), as under Django.
        listener = asyncio.create_task(listen())
        responder = asyncio.create_task(respond())
        await asyncio.wait((listener, responder), return_when=asyncio.FIRST_COMPLETED)
        for task in (listener, responder):
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if responder.cancelled() or isinstance(responder.exception(), RequestAborted):
            return None
        return responder.result()

    async def _response(self, request: HttpRequest, view: View, kwargs: dict[str, str]) -> HttpResponseBase:
        try:
            response = await view(request, **kwargs)
        except RequestAborted:
            raise  # the client went away while its body was being read: nobody to answer
        except Exception as exc:
            handled = self.errors.process_exception(request, exc)
            response = handled if handled is not None else _internal_error()
        for middleware in reversed(self.inline):
            if hasattr(middleware, "process_response"):
                response = middleware.process_response(request, response)
        return response


def _internal_error() -> HttpResponse:  # pragma: no cover - ApiErrorMiddleware answers every /api/ path
    return error_response(500, "internal_error", "Internal server error.")
