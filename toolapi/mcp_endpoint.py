"""The organization's catalog as one MCP server (streamable HTTP) at /api/mcp.

It is an ASGI app of its own, mounted next to Django in config/asgi.py, because the SDK's session
manager speaks ASGI directly. Each request is authenticated with the same bearer rule as the HTTP
API; the server runs stateless so every request carries its own credentials and no session
outlives a token. Tool listing and calls go through the same selectors, validation and upstream
hub as the HTTP API, and are audited the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from common.auth import InvalidToken, bearer_from_header, cached_principal, principal_from_raw_token_cached
from common.errors import error_body
from common.principal import Principal
from toolapi import catalog, selectors, services
from toolapi.models import CallChannel, CallStatus, McpTool
from toolapi.upstream import UpstreamError, UpstreamTimeout, UpstreamUnreachable, hub
from toolapi.validation import validation_details

logger = logging.getLogger(__name__)

MCP_PATHS = ("/api/mcp", "/api/mcp/")
PRINCIPAL_SCOPE_KEY = "svc.principal"
INVALID_PARAMS = -32602

Scope = dict[str, Any]
Receive = Any
Send = Any


def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    request = ctx.request
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY) if request is not None else None
    if not isinstance(principal, Principal):  # only reachable if the mount is bypassed
        raise MCPError(code=INVALID_PARAMS, message="Not authenticated.")
    return principal


def _as_mcp_tool(tool: McpTool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        title=tool.title or None,
        description=tool.description or None,
        input_schema=tool.input_schema or {"type": "object"},
        output_schema=tool.output_schema,
        annotations=types.ToolAnnotations.model_validate(tool.annotations) if tool.annotations else None,
    )


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    principal = _principal(ctx)
    tools = await sync_to_async(lambda: [_as_mcp_tool(tool) for tool in selectors.catalog_tools(principal=principal)])()
    return types.ListToolsResult(tools=tools)


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


async def _call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    principal = _principal(ctx)
    started = time.perf_counter()
    found = catalog.cached_tool(principal=principal, name=params.name) or await sync_to_async(catalog.tool_for_call)(
        principal=principal, name=params.name
    )
    if found is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
    tool = found.tool
    arguments = params.arguments or {}
    request_bytes = len(json.dumps(arguments))

    async def audit(status: CallStatus, is_error: bool, response_bytes: int) -> None:
        record = sync_to_async(services.record_call)(
            principal=principal,
            tool=tool,
            channel=CallChannel.MCP,
            status=status,
            is_error=is_error,
            duration_ms=(time.perf_counter() - started) * 1000,
            request_bytes=request_bytes,
            response_bytes=response_bytes,
        )
        await asyncio.shield(record)

    details = validation_details(tool.input_schema, arguments)
    if details is not None:
        # Per MCP, argument errors are tool results the model can read and correct, not protocol errors.
        result = _error_result("Invalid arguments: " + json.dumps(details["errors"]))
        await audit(CallStatus.INVALID, True, 0)
        return result

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        try:
            await ctx.session.report_progress(progress, total, message)
        except Exception as exc:  # the caller may have stopped listening; the call goes on
            logger.debug("progress not relayed: %s", exc)

    try:
        result = await hub.call_tool(found.target, tool.upstream_name, arguments, progress)
    except asyncio.CancelledError:
        await audit(CallStatus.CANCELLED, True, 0)
        raise
    except UpstreamError as exc:
        status = (
            CallStatus.TIMEOUT
            if isinstance(exc, UpstreamTimeout)
            else CallStatus.UNREACHABLE
            if isinstance(exc, UpstreamUnreachable)
            else CallStatus.UPSTREAM_ERROR
        )
        await audit(status, True, 0)
        return _error_result(str(exc))
    # The upstream's own _meta (its serverInfo stamp) describes the upstream, not this server.
    result = result.model_copy(update={"meta": None})
    size = len(result.model_dump_json(by_alias=True, exclude_none=True))
    await audit(CallStatus.TOOL_ERROR if result.is_error else CallStatus.OK, bool(result.is_error), size)
    return result


def build_server() -> Server[Any]:
    return Server("svc-tools", on_list_tools=_list_tools, on_call_tool=_call_tool)


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _authenticate(header: str | None) -> Principal | tuple[str, str]:
    raw = bearer_from_header(header)
    if raw is None:
        return ("not_authenticated", "Authentication credentials were not provided.")
    try:
        return principal_from_raw_token_cached(raw)
    except InvalidToken:
        return ("authentication_failed", "Invalid or expired token.")


class McpEndpoint:
    """ASGI app for /api/mcp: bearer auth, then the SDK's stateless streamable-HTTP handler.

    The SDK's session manager must be running (its ``run()`` context) before it serves requests, and
    is normally started from an ASGI lifespan event. The service runs under uvicorn with
    ``--lifespan off``, so no such event arrives (nor under a server without lifespan support): the
    manager is started on the first request, in a background task of the serving event loop that lives
    as long as the loop.
    """

    def __init__(self) -> None:
        self._managers: dict[int, tuple[asyncio.AbstractEventLoop, StreamableHTTPSessionManager]] = {}
        self._starting: dict[int, asyncio.Future[StreamableHTTPSessionManager]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def _manager(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        known = self._managers.get(id(loop))
        if known is not None and known[0] is loop:
            return known[1]
        pending = self._starting.get(id(loop))
        if pending is not None and pending.get_loop() is loop:
            return await asyncio.shield(pending)
        started: asyncio.Future[StreamableHTTPSessionManager] = loop.create_future()
        self._starting[id(loop)] = started
        manager = StreamableHTTPSessionManager(
            app=build_server(),
            stateless=True,
            # Host and Origin checks are Django's ALLOWED_HOSTS business, as for every other route.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

        async def run() -> None:
            try:
                async with manager.run():
                    self._managers[id(loop)] = (loop, manager)
                    started.set_result(manager)
                    await asyncio.Event().wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise
            finally:
                self._managers.pop(id(loop), None)
                self._starting.pop(id(loop), None)

        task = loop.create_task(run(), name="mcp-session-manager")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(started)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        raw = bearer_from_header(headers.get("authorization"))
        outcome = (cached_principal(raw) if raw else None) or await sync_to_async(_authenticate)(
            headers.get("authorization")
        )
        if not isinstance(outcome, Principal):
            code, message = outcome
            await _send_json(send, 401, error_body(code, message), [(b"www-authenticate", b'Bearer realm="api"')])
            return
        hub.adopt_running_loop()
        manager = await self._manager()
        try:
            await manager.handle_request({**scope, PRINCIPAL_SCOPE_KEY: outcome}, receive, send)
        finally:
            # What Django's request_finished signal does for its own requests: honour CONN_MAX_AGE.
            await sync_to_async(close_old_connections)()


class WithMcpEndpoint:
    """Sends /api/mcp to the MCP endpoint and every other HTTP request to ``app`` (Django)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.endpoint = McpEndpoint()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "http" and scope.get("path") in MCP_PATHS:
            await self.endpoint(scope, receive, send)
        else:
            await self.app(scope, receive, send)
