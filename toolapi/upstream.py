"""Connections to upstream MCP servers, shared by every request of the process.

Under an ASGI server, requests call upstreams on the server's own event loop (adopted by the ASGI
entry points, see adopt_running_loop). Everything else (sync views in worker threads, the Django test
client, Celery workers, management commands) hands its coroutine to one event loop in a dedicated
thread and awaits the result. Each of these (at most two) loops keeps its own sessions, so:

- one long-lived MCP session per upstream and loop is reused by every call (no handshake per call),
  whatever thread the caller runs on;
- cancelling the caller (a client that hung up) cancels the upstream call, which the SDK turns into
  a cancellation the upstream server observes;
- a broken upstream only fails the calls that go to it.

Calling on the server's loop matters for latency: a call handed to another thread's loop pays two
cross-thread wake-ups and contends for the GIL with the request's thread on every message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import hashlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from django.conf import settings
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

logger = logging.getLogger(__name__)

T = TypeVar("T")
ListChangedCallback = Callable[[str], None]

# A cursor loop that never ends must not hang discovery.
MAX_LIST_PAGES = 1000
# JSON-RPC "connection closed": the session is gone, a new one is needed.
CONNECTION_CLOSED = -32000
# The streamable-HTTP header naming the session (handshake era; 2026-07-28 requests carry none).
SESSION_ID_HEADER = "mcp-session-id"
# A lost list-change stream is reopened after this long, doubling up to the maximum, so an upstream
# that is down is not hammered while one that restarted is heard again within seconds.
LISTEN_RETRY_SECONDS = 1.0
LISTEN_RETRY_MAX_SECONDS = 30.0


class UpstreamError(Exception):
    """Base of the failures that are the upstream's fault, each mapped to an HTTP status."""


class UpstreamUnreachable(UpstreamError):  # noqa: N818 - reads as a condition, like Http404
    pass


class UpstreamTimeout(UpstreamError):  # noqa: N818 - reads as a condition, like Http404
    pass


class UpstreamProtocolError(UpstreamError):
    pass


@dataclass(frozen=True)
class UpstreamTarget:
    server_id: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0

    @property
    def key(self) -> str:
        # Headers are part of the identity so a credential change opens a new session, but only a
        # digest is kept so credentials never end up in log lines or repr()s.
        material = repr((self.url, self.headers)).encode()
        return f"{self.server_id}:{hashlib.sha256(material).hexdigest()[:16]}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


@dataclass
class _Connection:
    target: UpstreamTarget
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client: Client | None = None
    error: BaseException | None = None
    last_used: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    # The upstream answered 404 to this session's id: it no longer knows the session (restarted, or
    # expired it), so the session is useless however healthy its task looks.
    forgotten: bool = False

    @property
    def alive(self) -> bool:
        return self.client is not None and self.task is not None and not self.task.done() and not self.forgotten


class UpstreamHub:
    def __init__(self) -> None:
        self.on_list_changed: ListChangedCallback | None = None
        self._lock = threading.Lock()
        # The dedicated thread's loop, and the ASGI server's loop once adopted.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._served: asyncio.AbstractEventLoop | None = None
        # Sessions belong to the loop that opened them.
        self._sessions: dict[asyncio.AbstractEventLoop, dict[str, _Connection]] = {}
        # Strong references: the event loop keeps only weak ones to its tasks.
        self._reapers: set[asyncio.Task[None]] = set()

    @property
    def connect_timeout(self) -> float:
        return float(settings.TOOLAPI_CONNECT_TIMEOUT_SECONDS)

    @property
    def idle_seconds(self) -> float:
        return float(settings.TOOLAPI_UPSTREAM_IDLE_SECONDS)

    # -- loops --------------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                return self._loop
            loop = asyncio.new_event_loop()
            self._sessions[loop] = {}
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                self._keep(loop.create_task(self._reap_idle()))
                loop.run_forever()

            thread = threading.Thread(target=run, name="toolapi-upstreams", daemon=True)
            thread.start()
            started.wait()
            self._loop, self._thread = loop, thread
            return loop

    def adopt_running_loop(self) -> None:
        """Call upstreams directly on the running (ASGI server's) loop from now on.

        Called by the ASGI entry points on every request; only the first call on a loop does
        anything, and it does not touch the sessions of the dedicated thread's loop.
        """
        loop = asyncio.get_running_loop()
        if self._served is loop:
            return
        with self._lock:
            for gone in [known for known in self._sessions if known.is_closed()]:
                del self._sessions[gone]
            self._sessions.setdefault(loop, {})
            self._served = loop
        self._keep(loop.create_task(self._reap_idle(), context=contextvars.Context()))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    @property
    def _connections(self) -> dict[str, _Connection]:
        """The sessions of the running loop (only ever used on a hub loop)."""
        return self._sessions[asyncio.get_running_loop()]

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on a hub loop: this one if adopted, else the thread's; cancelling the caller cancels it."""
        if asyncio.get_running_loop() is self._served:
            return await coro
        future = self._submit(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._submit(coro).result(timeout)

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.idle_seconds))
            now = time.monotonic()
            for key, conn in list(self._connections.items()):
                if now - conn.last_used > self.idle_seconds:
                    self._drop(key, conn)

    # -- sessions -----------------------------------------------------------------------------

    def _drop(self, key: str, conn: _Connection) -> None:
        if self._connections.get(key) is conn:
            del self._connections[key]
        conn.stop.set()

    async def _own(self, conn: _Connection) -> None:
        """The task that owns one session: the SDK's task groups must be entered and left by one task."""
        target = conn.target
        server_id = target.server_id

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                self._notify_changed(server_id)

        async def on_response(response: httpx2.Response) -> None:
            # Streamable HTTP: a 404 to a request carrying the session id means the server no longer
            # knows the session and did not process the request; a new session is needed. The SDK
            # reports it as an ordinary error, so without this the dead session would be kept and
            # every call would fail. A restarted upstream may also have changed its tools while
            # nobody was listening, so they are rediscovered.
            if response.status_code == 404 and SESSION_ID_HEADER in response.request.headers and not conn.forgotten:
                conn.forgotten = True
                logger.info("upstream %s (%s) forgot our session; opening a new one", server_id, target.url)
                self._notify_changed(server_id)

        try:
            # No read timeout on the socket: a call may legitimately stream for minutes, and every
            # operation is bounded by the server's own timeout instead (see _with_session).
            timeout = httpx2.Timeout(self.connect_timeout, read=None)
            async with create_mcp_http_client(headers=dict(target.headers), timeout=timeout) as http:
                http.event_hooks["response"].append(on_response)
                transport = streamable_http_client(target.url, http_client=http)
                async with Client(transport, message_handler=on_message, cache=None) as client:
                    conn.client = client
                    conn.ready.set()
                    try:
                        async with anyio.create_task_group() as group:
                            group.start_soon(self._watch_list_changes, client, server_id)
                            await conn.stop.wait()
                            group.cancel_scope.cancel()
                    finally:
                        conn.client = None
        except BaseException as exc:
            conn.error = exc
            if not isinstance(exc, asyncio.CancelledError):
                logger.info("upstream %s (%s) session ended: %s", server_id, target.url, _describe(exc))
        finally:
            conn.ready.set()
            if self._connections.get(target.key) is conn:
                del self._connections[target.key]

    async def _watch_list_changes(self, client: Client, server_id: str) -> None:
        """Follow a 2026-07-28 server's list changes for as long as the session lives.

        Older servers send the notification on the session itself (handled in on_message), and a
        server may not offer change streams at all. A stream that ends (upstream restarted, network
        blip) is opened again with backoff, and the tools are then refetched: changes made while it
        was down were announced to nobody. Without that, a session outliving an upstream restart
        would keep working for calls but never hear of a change again.
        """
        delay = LISTEN_RETRY_SECONDS
        reopening = False
        while True:
            opened_at: float | None = None
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    if not subscription.honored.tools_list_changed:
                        return
                    opened_at = time.monotonic()
                    if reopening:
                        self._notify_changed(server_id)
                    async for _event in subscription:
                        self._notify_changed(server_id)
            except ListenNotSupportedError:
                return
            except MCPError as exc:
                if exc.code == types.METHOD_NOT_FOUND:
                    logger.debug("no list-change stream from %s: %s", server_id, _describe(exc))
                    return
                logger.debug("list-change stream from %s ended: %s", server_id, _describe(exc))
            except Exception as exc:
                logger.debug("list-change stream from %s ended: %s", server_id, _describe(exc))
            # Only a stream that stayed up a while resets the backoff: one the server keeps closing
            # right after opening it must not cost a rediscovery every second.
            if opened_at is not None and time.monotonic() - opened_at > LISTEN_RETRY_MAX_SECONDS:
                delay = LISTEN_RETRY_SECONDS
            await asyncio.sleep(delay)
            delay = min(delay * 2, LISTEN_RETRY_MAX_SECONDS)
            reopening = True

    def _notify_changed(self, server_id: str) -> None:
        callback = self.on_list_changed
        if callback is None:
            return
        # The callback touches the database: keep it off the hub loop.
        threading.Thread(target=callback, args=(server_id,), name="toolapi-refresh", daemon=True).start()

    async def _session(self, target: UpstreamTarget) -> tuple[_Connection, Client]:
        conn = self._connections.get(target.key)
        if conn is not None and conn.ready.is_set() and not conn.alive:
            self._drop(target.key, conn)  # a forgotten session's task still runs: end it
            conn = None
        if conn is None:
            conn = _Connection(target=target)
            self._connections[target.key] = conn
            # A fresh context: the session outlives the request that happened to open it.
            conn.task = asyncio.get_running_loop().create_task(self._own(conn), context=contextvars.Context())
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready.wait()), self.connect_timeout)
        except TimeoutError:
            # Accepting connections but never answering the handshake counts as unreachable.
            self._drop(target.key, conn)
            if conn.task is not None:
                conn.task.cancel()
            raise UpstreamUnreachable("Upstream MCP server did not complete the handshake in time.") from None
        conn.last_used = time.monotonic()
        if conn.client is None:
            raise UpstreamUnreachable(f"Upstream MCP server is unreachable: {_describe(conn.error or Exception())}")
        return conn, conn.client

    def close_server(self, server_id: str) -> None:
        """Forget the sessions of a server whose settings changed or which was deleted."""

        def close() -> None:
            for key, conn in list(self._connections.items()):
                if conn.target.server_id == server_id:
                    self._drop(key, conn)

        with self._lock:
            loops = list(self._sessions)
        for loop in loops:
            if loop.is_running():
                loop.call_soon_threadsafe(close)

    # -- operations ---------------------------------------------------------------------------

    async def _with_session(self, target: UpstreamTarget, operation: Callable[[Client], Awaitable[T]]) -> T:
        for attempt in (1, 2):
            conn, client = await self._session(target)
            try:
                with anyio.fail_after(target.timeout):
                    return await operation(client)
            except TimeoutError as exc:
                raise UpstreamTimeout(f"The upstream did not answer within {target.timeout:g} s.") from exc
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED or not conn.alive:
                    # A pooled session that died or was forgotten since its last use (upstream
                    # restarted): the request never reached a live session, so one retry on a fresh
                    # session is safe.
                    self._drop(target.key, conn)
                    if attempt == 1:
                        continue
                    raise UpstreamUnreachable(f"Upstream MCP server closed the connection: {exc}") from exc
                raise UpstreamProtocolError(f"Upstream MCP error {exc.code}: {exc}") from exc
            except UpstreamError:
                raise
            except Exception as exc:
                if not conn.alive:
                    self._drop(target.key, conn)
                    if attempt == 1:
                        continue
                    raise UpstreamUnreachable(f"Upstream MCP server is unreachable: {_describe(exc)}") from exc
                raise UpstreamProtocolError(f"Upstream MCP server failed: {_describe(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_tool(
        self,
        target: UpstreamTarget,
        name: str,
        arguments: dict[str, Any],
        progress: ProgressFnT | None = None,
    ) -> types.CallToolResult:
        caller_loop = asyncio.get_running_loop()
        relay: ProgressFnT | None = None
        if progress is not None:
            callback = progress

            async def relay(progress: float, total: float | None, message: str | None) -> None:
                # Progress arrives on the hub loop; the caller's stream lives on its own loop.
                asyncio.run_coroutine_threadsafe(callback(progress, total, message), caller_loop)

        async def operation(client: Client) -> types.CallToolResult:
            return await client.call_tool(name, arguments, progress_callback=relay)

        return await self._run(self._with_session(target, operation))

    async def _list(self, target: UpstreamTarget) -> list[types.Tool]:
        async def operation(client: Client) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        return await self._with_session(target, operation)

    async def list_tools(self, target: UpstreamTarget) -> list[types.Tool]:
        return await self._run(self._list(target))

    def list_tools_sync(self, target: UpstreamTarget) -> list[types.Tool]:
        return self.run_sync(self._list(target))


hub = UpstreamHub()
