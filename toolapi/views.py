"""The tool HTTP API: the OpenAPI document and tool calls (JSON, form fields, or an SSE stream).

These are plain async views rather than DRF views: a call may stream for minutes and must notice
the caller leaving, which DRF's synchronous request cycle cannot do. Under ASGI they are reached
through toolapi.asgi, which runs them without Django's URL resolver and middleware stack; Django's
own routes (root_urls) serve them everywhere else (tests' client, WSGI) with the same behaviour.

A call with a warm cache (the caller's principal and the tool lookup, see common.auth and
toolapi.catalog) does no database work and no thread hop before the upstream call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from common.auth import bearer_from_header, cached_principal, principal_for_request_cached
from common.errors import ApiError, error_body, error_response
from common.principal import Principal
from toolapi import catalog, services
from toolapi.models import CallChannel, CallStatus, McpTool
from toolapi.upstream import UpstreamProtocolError, UpstreamTarget, UpstreamTimeout, UpstreamUnreachable, hub
from toolapi.validation import coerce_form, validation_details

logger = logging.getLogger(__name__)

JSON_TYPES = ("application/json", "text/json")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

P = ParamSpec("P")
R = TypeVar("R")

# Set by toolapi.asgi for the requests it serves. They run outside Django's request cycle, whose
# request_finished signal would release database connections, so their database work releases the
# connection itself. Never set under Django's cycle: there (and in tests) the cycle owns it.
OUTSIDE_REQUEST_CYCLE: ContextVar[bool] = ContextVar("toolapi_outside_request_cycle", default=False)


def _in_thread(fn: Callable[P, R]) -> Callable[P, Any]:
    """``fn`` (database work) as a coroutine function running in the shared sync thread."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        finally:
            if OUTSIDE_REQUEST_CYCLE.get():
                close_old_connections()

    return sync_to_async(run)


class AuditedResponse(HttpResponse):
    """Carries the call's audit record, written once the response was sent.

    Under Django's cycle the record is written when the server closes the response; toolapi.asgi
    hands it to the batched writer (toolapi.recording) instead. Either way the record is complete
    (status, sizes, duration up to the response) and the write is not part of the caller's latency.
    """

    # The keyword arguments of services.record_call.
    record: dict[str, Any] | None = None

    def take_record(self) -> dict[str, Any] | None:
        record, self.record = self.record, None
        return record

    def close(self) -> None:
        try:
            super().close()
        finally:
            record = self.take_record()
            if record is not None:
                try:
                    services.record_call(**record)
                except Exception:
                    logger.exception("recording a tool call failed")


def _server_url(request: HttpRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


def _openapi(request: HttpRequest) -> bytes:
    principal = principal_for_request_cached(request)
    if request.method not in ("GET", "HEAD"):
        raise ApiError(status_code=405, code="method_not_allowed", message="Method not allowed.")
    return catalog.openapi_bytes(principal=principal, server_url=_server_url(request))


_openapi_in_thread = _in_thread(_openapi)


@csrf_exempt
async def openapi_json(request: HttpRequest) -> HttpResponseBase:
    try:
        body = await _openapi_in_thread(request)
    except ApiError as exc:
        return error_response(exc.status_code, exc.code, exc.message, exc.details)
    return HttpResponse(body, content_type="application/json")


@dataclass
class _Call:
    principal: Principal
    tool: McpTool
    target: UpstreamTarget


def _check_method(request: HttpRequest) -> None:
    if request.method != "POST":
        raise ApiError(status_code=405, code="method_not_allowed", message="Tools are called with POST.")


def _resolve_sync(request: HttpRequest, tool_name: str) -> _Call:
    """Authenticate and look the tool up in one thread hop: each hop costs latency on every call."""
    principal = principal_for_request_cached(request)
    _check_method(request)
    found = catalog.tool_for_call(principal=principal, name=tool_name)
    if found is None:
        raise ApiError(status_code=404, code="not_found", message=f"Tool {tool_name!r} not found.")
    return _Call(principal=principal, tool=found.tool, target=found.target)


_resolve_in_thread = _in_thread(_resolve_sync)


async def _resolve(request: HttpRequest, tool_name: str) -> _Call:
    """The caller and the tool: from the caches when warm, else one hop to the database.

    Checks run in the same order either way (401, then 405, then 404).
    """
    raw = bearer_from_header(request.headers.get("Authorization"))
    principal = cached_principal(raw) if raw else None
    if principal is not None:
        _check_method(request)
        found = catalog.cached_tool(principal=principal, name=tool_name)
        if found is not None:
            return _Call(principal=principal, tool=found.tool, target=found.target)
    result: _Call = await _resolve_in_thread(request, tool_name)
    return result


def _arguments(request: HttpRequest, tool: McpTool) -> Any:
    content_type = (request.content_type or "").lower()
    if content_type in FORM_TYPES:
        return coerce_form({key: request.POST.getlist(key) for key in request.POST}, tool.input_schema)
    if request.body.strip() == b"":
        return {}
    if content_type and content_type not in JSON_TYPES and not content_type.endswith("+json"):
        raise ApiError(
            status_code=415,
            code="unsupported_media_type",
            message="Send the arguments as application/json or as form fields.",
        )
    try:
        return json.loads(request.body)
    except ValueError as exc:
        raise ApiError(status_code=400, code="malformed_request", message=f"The body is not valid JSON: {exc}") from exc


def _upstream_error(exc: Exception) -> tuple[int, str, CallStatus]:
    if isinstance(exc, UpstreamTimeout):
        return 504, "upstream_timeout", CallStatus.TIMEOUT
    if isinstance(exc, UpstreamUnreachable):
        return 502, "upstream_unreachable", CallStatus.UNREACHABLE
    return 502, "upstream_error", CallStatus.UPSTREAM_ERROR


_record_call_in_thread = _in_thread(services.record_call)


async def _audit(
    call: _Call, channel: CallChannel, status: CallStatus, is_error: bool, started: float, sizes: tuple[int, int]
) -> None:
    record = _record_call_in_thread(
        principal=call.principal,
        tool=call.tool,
        channel=channel,
        status=status,
        is_error=is_error,
        duration_ms=(time.perf_counter() - started) * 1000,
        request_bytes=sizes[0],
        response_bytes=sizes[1],
    )
    try:
        # Shielded: a call whose caller went away is still recorded.
        await asyncio.shield(record)
    except Exception:
        logger.exception("recording the call of %s failed", call.tool.name)


def _wants_stream(request: HttpRequest) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


@csrf_exempt
async def call_tool(request: HttpRequest, tool_name: str) -> HttpResponseBase:
    started = time.perf_counter()
    try:
        call = await _resolve(request, tool_name)
        arguments = _arguments(request, call.tool)
    except ApiError as exc:
        return error_response(exc.status_code, exc.code, exc.message, exc.details)
    # From the header: a multipart body has been consumed by the parser and cannot be measured again.
    request_bytes = int(request.META.get("CONTENT_LENGTH") or 0)

    details = validation_details(call.tool.input_schema, arguments)
    if details is not None:
        await _audit(call, CallChannel.HTTP, CallStatus.INVALID, True, started, (request_bytes, 0))
        return error_response(400, "validation_error", "The arguments do not match the tool's input schema.", details)

    if _wants_stream(request):
        return _stream(call, arguments, started, request_bytes)

    try:
        result = await hub.call_tool(call.target, call.tool.upstream_name, arguments)
    except asyncio.CancelledError:
        await _audit(call, CallChannel.HTTP, CallStatus.CANCELLED, True, started, (request_bytes, 0))
        raise
    except (UpstreamUnreachable, UpstreamTimeout, UpstreamProtocolError) as exc:
        status_code, code, status = _upstream_error(exc)
        body: dict[str, Any] = error_body(code, str(exc))
        status, is_error = status, True
    else:
        status_code, body = 200, catalog.serialize_result(result)
        status = CallStatus.TOOL_ERROR if result.is_error else CallStatus.OK
        is_error = bool(result.is_error)
    response = AuditedResponse(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
        status=status_code,
        content_type="application/json",
    )
    response.record = {
        "principal": call.principal,
        "tool": call.tool,
        "channel": CallChannel.HTTP,
        "status": status,
        "is_error": is_error,
        "duration_ms": (time.perf_counter() - started) * 1000,
        "request_bytes": request_bytes,
        "response_bytes": len(response.content),
    }
    return response


def _stream(call: _Call, arguments: Any, started: float, request_bytes: int) -> StreamingHttpResponse:
    """SSE: `: keepalive` comments while the tool runs, then one standard `data:` event, then EOF.

    The result is a plain `data:` line (the default "message" event) because that is what
    EventSource and every SSE library deliver; comment lines are ignored by them, which is exactly
    what keepalives are for. An upstream failure after the stream started is sent as an
    `event: error` whose data is the usual error body.
    """
    interval = float(settings.TOOLAPI_KEEPALIVE_SECONDS)

    async def events() -> AsyncIterator[bytes]:
        task: asyncio.Task[types.CallToolResult] = asyncio.ensure_future(
            hub.call_tool(call.target, call.tool.upstream_name, arguments)
        )
        status, is_error, sent = CallStatus.CANCELLED, True, 0
        try:
            while True:
                done, _pending = await asyncio.wait({task}, timeout=interval)
                if done:
                    break
                chunk = b": keepalive\n\n"
                sent += len(chunk)
                yield chunk
            try:
                result = task.result()
            except (UpstreamUnreachable, UpstreamTimeout, UpstreamProtocolError) as exc:
                status_code, code, status = _upstream_error(exc)
                body = error_body(code, str(exc), {"status": status_code})
                chunk = b"event: error\ndata: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
            else:
                status = CallStatus.TOOL_ERROR if result.is_error else CallStatus.OK
                is_error = bool(result.is_error)
                payload = json.dumps(catalog.serialize_result(result), separators=(",", ":"), ensure_ascii=False)
                chunk = b"data: " + payload.encode() + b"\n\n"
            sent += len(chunk)
            yield chunk
        finally:
            if not task.done():
                # The caller went away: stop the upstream call too.
                task.cancel()
                status, is_error = CallStatus.CANCELLED, True
            await _audit(call, CallChannel.SSE, status, is_error, started, (request_bytes, sent))

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    # Reverse proxies (nginx) would otherwise hold the keepalives back in their buffers.
    response["X-Accel-Buffering"] = "no"
    return response
