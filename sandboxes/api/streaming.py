"""exec, read-file and write-file: async views that relay the sandbox daemon's streams.

Nothing here buffers a whole output or file: each chunk the daemon sends is forwarded as it arrives,
so server memory is bounded by a chunk, and a client that goes away cancels the work (Django cancels
the response task; closing the daemon connection kills the command's process group).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.utils import timezone

from audit.models import EventType
from audit.services import OutputCapture, client_address, record_event, record_events
from common.asyncviews import api_async_view
from common.batching import BatchWriter
from common.errors import ApiError
from common.fastpath import FileDescriptorResponse, body_chunks, splice_body_into, streams_body
from common.permissions import require_writable
from common.principal import Principal
from sandboxd.protocol import CHUNK_SIZE, ErrorCode, TextDecoder
from sandboxes import services
from sandboxes.api.serializers import parse_exec_request
from sandboxes.daemon_client import (
    DaemonClient,
    DaemonError,
    DaemonUnavailable,
    DescriptorFileReader,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecStream,
)

# Exit code of the `done` line when the command has no exit status of its own: it never started
# (missing workdir) or its fate is unknown (the sandbox stopped responding).
NO_EXIT_STATUS = -1

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Operations on one sandbox within this many seconds of the last recorded activity write nothing:
# the reaper counts idleness in minutes, and a write per exec is a commit each.
TOUCH_INTERVAL_SECONDS = 1.0

# Output already waiting behind a chunk is sent with it in one line, up to this many bytes.
COALESCE_BYTES = 1024 * 1024
# Daemon events read ahead of the client (each at most one pipe read, a few KiB to 1 MiB).
READ_AHEAD = 16


@dataclass(frozen=True)
class Operation:
    principal: Principal
    sandbox_id: str
    client: DaemonClient
    address: str
    # The daemon client came from this process's memory of running sandboxes, not the database:
    # if its daemon is gone, the sandbox may have been destroyed elsewhere (see _refreshed).
    remembered: bool


def _lookup(principal: Principal, sandbox_id: str) -> DaemonClient:
    client = services.running_daemon_client(principal=principal, sandbox_id=sandbox_id)
    services.touch(sandbox_id=sandbox_id, unless_within=TOUCH_INTERVAL_SECONDS)
    return client


# One thread hop for the lookup and the activity update together.
_alookup = sync_to_async(_lookup, thread_sensitive=False)
_atouch = sync_to_async(services.record_activity, thread_sensitive=False)


async def _aprepare(principal: Principal, request: HttpRequest, sandbox_id: str) -> Operation:
    """The caller's running sandbox and its daemon; without a database query while remembered."""
    require_writable(principal)
    address = client_address(request)
    client = services.cached_daemon_client(organization_id=principal.organization.pk, sandbox_id=sandbox_id)
    if client is None:
        return Operation(principal, sandbox_id, await _alookup(principal, sandbox_id), address, remembered=False)
    if services.touch_due(sandbox_id, TOUCH_INTERVAL_SECONDS):
        await _atouch(sandbox_id)
    return Operation(principal, sandbox_id, client, address, remembered=True)


async def _refreshed(operation: Operation, request: HttpRequest) -> Operation | None:
    """After a remembered daemon turned out unreachable: the sandbox as the database has it now.

    Raises the answer the database gives (410 for a sandbox destroyed meanwhile, by the reaper say);
    None when the daemon was not a remembered one (nothing new to learn).
    """
    if not operation.remembered:
        return None
    services.forget_running(operation.sandbox_id)
    return await _aprepare(operation.principal, request, operation.sandbox_id)


async def _on_daemon(
    operation: Operation,
    request: HttpRequest,
    call: Callable[[DaemonClient], Awaitable[T]],
    *,
    may_retry: Callable[[], bool] = lambda: True,
) -> tuple[Operation, T]:
    """``call`` on the sandbox's daemon; if a remembered daemon is gone, once more after the database
    was asked again (which answers 410 for a sandbox destroyed meanwhile). Returns the operation
    the call succeeded with."""
    try:
        return operation, await call(operation.client)
    except DaemonUnavailable:
        refreshed = await _refreshed(operation, request) if may_retry() else None
        if refreshed is None:
            raise
        return refreshed, await call(refreshed.client)


def _record_events(batch: list[dict[str, Any]]) -> None:
    # One statement for the batch: one commit however many operations finished meanwhile.
    try:
        record_events(batch)
        return
    except Exception:
        if len(batch) == 1:
            raise
        logger.exception("recording %d sandbox events together failed; recording them one by one", len(batch))
    # One bad event must not take the others with it.
    for event in batch:
        try:
            record_event(**event)
        except Exception:
            logger.exception("recording a %s event failed", event["event_type"])


# Audit without making the client wait for the database (or fail if it is slow); see common.batching.
audit_writer: BatchWriter[dict[str, Any]] = BatchWriter(_record_events, name="sandbox-audit-writer").flush_at_exit()


def record_in_background(operation: Operation, event_type: str, data: dict[str, Any]) -> None:
    audit_writer.submit(
        {
            # Now, not when the batch is written: the log keeps the order things happened in.
            "at": timezone.now(),
            "organization": operation.principal.organization,
            "event_type": event_type,
            "sandbox_id": operation.sandbox_id,
            "principal": operation.principal,
            "address": operation.address,
            "data": data,
        }
    )


_aheartbeat_touch = sync_to_async(services.touch, thread_sensitive=False)


class _Heartbeat:
    """Keeps a long-running operation counted as activity, so the reaper never takes a busy sandbox.

    A timer, not a task: most operations end long before the first beat, and a timer set and
    cancelled costs them next to nothing.
    """

    def __init__(self, sandbox_id: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._sandbox_id = sandbox_id
        self._touching: asyncio.Future[None] | None = None
        self._timer = self._loop.call_later(settings.SANDBOX_ACTIVITY_HEARTBEAT_SECONDS, self._beat)

    def _beat(self) -> None:
        if self._touching is None or self._touching.done():
            self._touching = asyncio.ensure_future(_aheartbeat_touch(sandbox_id=self._sandbox_id))
        self._timer = self._loop.call_later(settings.SANDBOX_ACTIVITY_HEARTBEAT_SECONDS, self._beat)

    def stop(self) -> None:
        self._timer.cancel()


def _line(payload: dict[str, Any]) -> bytes:
    # orjson: escaping a megabyte of output is most of what relaying it costs, and orjson does it
    # several times faster than the standard library, straight to UTF-8 bytes.
    return orjson.dumps(payload, option=orjson.OPT_APPEND_NEWLINE)


def _parse_json(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(status_code=400, code="malformed_request", message="Body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(status_code=400, code="malformed_request", message="Body must be a JSON object.")
    return body


class _End:
    """The daemon's events ended, normally (``error`` None) or with ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def _coalesced(events: AsyncIterable[ExecEvent]) -> AsyncGenerator[ExecEvent, None]:
    """``events``, with output chunks of one stream that are already waiting joined into one.

    The daemon forwards a pipe's output as the pipe gives it (64 KiB at a time when a command
    writes fast), and every chunk costs a JSON line and a send. Events are read ahead (at most
    READ_AHEAD of them, so memory stays bounded) and whatever is already waiting behind a chunk is
    joined to it, up to COALESCE_BYTES: nothing waits for more output to arrive, so the first bytes
    and a slow command's output go out as early as before.
    """
    queue: asyncio.Queue[ExecEvent | _End] = asyncio.Queue(READ_AHEAD)

    async def read() -> None:
        try:
            async for event in events:
                await queue.put(event)
        except Exception as exc:
            await queue.put(_End(exc))
        else:
            await queue.put(_End())
        finally:
            # Cancelled while waiting for room in the queue, the daemon call is paused at a yield:
            # close it here, or the command would run on until the connection is collected.
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    reader = asyncio.ensure_future(read())
    held: ExecEvent | _End | None = None
    try:
        while True:
            item = held if held is not None else await queue.get()
            held = None
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            if isinstance(item, ExecOutput):
                parts = [item.data]
                size = len(item.data)
                while size < COALESCE_BYTES and not queue.empty():
                    following = queue.get_nowait()
                    if isinstance(following, ExecOutput) and following.stream == item.stream:
                        parts.append(following.data)
                        size += len(following.data)
                    else:
                        held = following
                        break
                if len(parts) > 1:
                    item = ExecOutput(item.stream, b"".join(parts))
            yield item
    finally:
        # Stopping early (the client went away) closes the daemon call, which kills the command.
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def _exec_lines(
    operation: Operation, events: ExecStream | DaemonError, command: str, timeout_seconds: float, workdir: str
) -> AsyncIterator[bytes]:
    """The NDJSON lines of a command sent to the daemon (``events``), or of a failure to send it."""
    started = time.monotonic()
    captures = {"stdout": OutputCapture(), "stderr": OutputCapture()}
    decoders = {"stdout": TextDecoder(), "stderr": TextDecoder()}
    exit_code: int = NO_EXIT_STATUS
    outcome = "cancelled"
    heartbeat = _Heartbeat(operation.sandbox_id)
    try:
        try:
            if isinstance(events, DaemonError):
                raise events
            async for event in _coalesced(events):
                if isinstance(event, ExecOutput):
                    captures[event.stream].add(event.data)
                    text = decoders[event.stream].decode(event.data)
                    if text:
                        yield _line({"type": event.stream, "data": text})
                elif isinstance(event, ExecExit):
                    for name, decoder in decoders.items():
                        tail = decoder.flush()
                        if tail:
                            yield _line({"type": name, "data": tail})
                    exit_code = event.exit_code
                    outcome = "exited"
                    if event.timed_out:
                        outcome = "timed_out"
                        yield _line(
                            {
                                "type": "error",
                                "data": f"command timed out after {timeout_seconds:g}s; its process group was killed",
                            }
                        )
                    elif event.signal:
                        yield _line({"type": "error", "data": f"command was killed by signal {event.signal}"})
        except DaemonUnavailable as exc:
            outcome = "sandbox_unavailable"
            yield _line({"type": "error", "data": f"the sandbox stopped responding: {exc.message}"})
        except DaemonError as exc:
            outcome = exc.code
            message = exc.message
            if exc.code == ErrorCode.WORKDIR_MISSING:
                message = f"working directory {workdir} does not exist"
            yield _line({"type": "error", "data": message})
        yield _line({"type": "done", "exitCode": exit_code})
    finally:
        heartbeat.stop()
        if not isinstance(events, DaemonError):
            await events.aclose()
        record_in_background(
            operation,
            EventType.EXEC,
            {
                "command": command,
                "workdir": workdir,
                "timeout": timeout_seconds,
                "exitCode": exit_code if outcome in ("exited", "timed_out") else None,
                "outcome": outcome,
                "durationMs": round((time.monotonic() - started) * 1000, 1),
                **captures["stdout"].as_dict("stdout"),
                **captures["stderr"].as_dict("stderr"),
            },
        )


@api_async_view("POST")
async def exec_view(request: HttpRequest, principal: Principal, sandbox_id: str) -> StreamingHttpResponse:
    exec_request = parse_exec_request(_parse_json(request))
    command, timeout, workdir = exec_request.command, exec_request.timeout, exec_request.workdir
    operation = await _aprepare(principal, request, sandbox_id)
    events: ExecStream | DaemonError
    try:
        operation, events = await _on_daemon(
            operation, request, lambda client: client.start_exec(command, timeout=timeout, workdir=workdir)
        )
    except DaemonUnavailable as exc:
        events = exc  # reported in the stream, as the protocol says
    response = StreamingHttpResponse(
        _exec_lines(operation, events, command, timeout, workdir),
        content_type="application/x-ndjson",
    )
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response


_FILE_ERRORS: dict[str, tuple[int, str]] = {
    ErrorCode.NOT_FOUND: (404, "file_not_found"),
    ErrorCode.IS_DIRECTORY: (400, "is_a_directory"),
    ErrorCode.NOT_A_DIRECTORY: (400, "not_a_directory"),
    ErrorCode.INVALID_PATH: (400, "invalid_path"),
    ErrorCode.BAD_REQUEST: (400, "invalid_path"),
    ErrorCode.PERMISSION_DENIED: (403, "file_permission_denied"),
}


def _file_error(exc: DaemonError) -> ApiError:
    if isinstance(exc, DaemonUnavailable):
        return ApiError(
            status_code=503, code="sandbox_unavailable", message=f"The sandbox stopped responding: {exc.message}"
        )
    status, code = _FILE_ERRORS.get(exc.code, (500, "sandbox_io_error"))
    return ApiError(status_code=status, code=code, message=exc.message)


def _path_param(request: HttpRequest) -> str:
    path = request.GET.get("path", "")
    if not path:
        raise ApiError(
            status_code=400,
            code="validation_error",
            message="Query parameter path is required.",
            details={"fields": {"path": ["This field is required."]}},
        )
    if not path.startswith("/") or "\x00" in path:
        raise ApiError(
            status_code=400,
            code="validation_error",
            message="path must be an absolute path.",
            details={"fields": {"path": ["Must be an absolute path."]}},
        )
    return path


async def _file_chunks(operation: Operation, reader: Any, path: str) -> AsyncIterator[bytes]:
    sent = 0
    complete = False
    try:
        async for chunk in reader:
            sent += len(chunk)
            yield chunk
        complete = True
    finally:
        await reader.aclose()
        record_in_background(operation, EventType.READ_FILE, {"path": path, "bytes": sent, "complete": complete})


@api_async_view("POST")
async def read_file_view(request: HttpRequest, principal: Principal, sandbox_id: str) -> StreamingHttpResponse:
    path = _path_param(request)
    operation = await _aprepare(principal, request, sandbox_id)
    try:
        operation, reader = await _on_daemon(operation, request, lambda client: client.open_file(path))
    except DaemonError as exc:
        raise _file_error(exc) from exc
    chunks = _file_chunks(operation, reader, path)
    response: StreamingHttpResponse
    if isinstance(reader, DescriptorFileReader):
        # The file is open here: the server may send it straight from the page cache.
        opened = reader

        async def finished(sent: int, complete: bool) -> None:
            await opened.aclose()
            record_in_background(operation, EventType.READ_FILE, {"path": path, "bytes": sent, "complete": complete})

        response = FileDescriptorResponse(
            chunks, fd=reader.fd, size=reader.size, finished=finished, content_type="application/octet-stream"
        )
    else:
        response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
        # The daemon sends exactly the size the file had when opened (see sandboxd op_read).
        response["Content-Length"] = str(reader.size)
    response["Cache-Control"] = "no-store"
    return response


class _UploadBody:
    """A write-file's body: chunk by chunk as it arrives, or, where the daemon hands over the file
    and the server the socket, spliced from one into the other (common.zerocopy)."""

    def __init__(self, request: HttpRequest, limit: int, too_large: ApiError) -> None:
        self.request = request
        self.limit = limit
        self.too_large = too_large
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        total = 0
        async for chunk in body_chunks(self.request, CHUNK_SIZE):
            total += len(chunk)
            if total > self.limit:
                # Raising here aborts the daemon's temporary file: nothing half-written is left.
                raise self.too_large
            yield chunk

    async def splice_into(self, fd: int) -> int | None:
        # Spliced bodies have a Content-Length, already checked against the limit, and are read
        # to exactly that length.
        self.started = True
        return await splice_body_into(self.request, fd)


@streams_body
@api_async_view("POST")
async def write_file_view(request: HttpRequest, principal: Principal, sandbox_id: str) -> JsonResponse:
    if request.content_type != "application/octet-stream":
        raise ApiError(
            status_code=415, code="unsupported_media_type", message="Content-Type must be application/octet-stream."
        )
    path = _path_param(request)
    limit = settings.SANDBOX_WRITE_MAX_BYTES
    declared = request.META.get("CONTENT_LENGTH")
    too_large = ApiError(
        status_code=413,
        code="payload_too_large",
        message=f"Files are limited to {limit} bytes.",
        details={"maxBytes": limit},
    )
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large
    operation = await _aprepare(principal, request, sandbox_id)
    body = _UploadBody(request, limit, too_large)
    try:
        # Only a daemon that could not be reached at all (no byte of the body taken yet) is worth
        # asking the database about: a body cannot be read twice.
        operation, result = await _on_daemon(
            operation, request, lambda client: client.write_file(path, body), may_retry=lambda: not body.started
        )
    except DaemonError as exc:
        raise _file_error(exc) from exc
    record_in_background(operation, EventType.WRITE_FILE, {"path": result.path, "bytes": result.size})
    return JsonResponse({"path": result.path, "size": result.size})
