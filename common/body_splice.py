"""Request bodies moved from the client's socket into a file by the kernel (splice), not through Python.

An upload relayed through ASGI reaches the view as Python objects: the server copies each read of
the socket into bytes, the HTTP parser copies the body out of those, the server buffers and copies
it again for ``receive``, and the view copies it into the file, with an event-loop round per 64 KiB.
For a 1 GiB write-file that was most of the web process's time. The service's HTTP protocol
(``common.http_server``) can hand a request's socket over instead, through the ASGI scope's
extension ``BODY_SOCKET``; the body then goes socket → pipe → file with ``splice(2)`` in a worker
thread, which the kernel does by moving page references and one copy into the page cache.

A server without the extension (daphne, the test client, uvicorn's own protocols) simply does not
offer it, and the body is read through ``receive`` as before. See docs/sandboxes.md
("How an upload reaches the file").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import os
import select
import threading
import time
from typing import Protocol

# The ASGI scope extension (scope["extensions"][BODY_SOCKET]) that offers a request's socket.
BODY_SOCKET = "svc.body_socket"

# Below this many bytes still to come, a splice is not worth a thread and the connection's
# keep-alive (a connection whose body was spliced is closed after its response).
MIN_SPLICE_BYTES = 1024 * 1024
# Bodies spliced at once. A splice holds a worker thread while its client sends; bodies beyond
# this go through receive() as usual, so slow clients can never take every thread.
MAX_SPLICES = 8
# A client that sends no byte of its body for this long is dropped (its connection closed);
# the service's setting UPLOAD_STALL_SECONDS.
STALL_SECONDS = 120.0
# The pipe between socket and file: the most one splice moves. 1 MiB is the kernel's default
# limit for unprivileged processes; a smaller pipe only means more, smaller splices.
PIPE_BYTES = 1024 * 1024
# How often a waiting splice looks at its stop flag (a cancelled request, a stall).
_POLL_MS = 250


class TakenBody(Protocol):
    """A request body the server handed over: read the rest of it from ``fd``, then ``release``."""

    # A duplicate of the connection's socket, owned by the taker until release.
    fd: int
    # Body bytes the server had already read from the socket, to be written first.
    pending: bytes
    # Body bytes still in the socket (or still to be sent by the client).
    remaining: int

    def release(self, *, aborted: bool) -> None:
        """Give the connection back; ``aborted`` when the body could not be read to its end."""


class BodySocket(Protocol):
    """What the scope's ``BODY_SOCKET`` extension holds."""

    def take(self, min_remaining: int) -> TakenBody | None:
        """The rest of the body, if at least ``min_remaining`` bytes of it are still to come and
        it was not read yet; None leaves the request as it was (read it through ``receive``)."""


class ClientGoneError(Exception):
    """The client closed its connection, or stalled, before sending its whole body."""


_executor = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_SPLICES, thread_name_prefix="body-splice")
_active = 0  # splices running; only touched from the event loop


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]
    return offset


def _wait_readable(poller: select.poll, stop: threading.Event, idle_since: float, stall_seconds: float) -> None:
    if stop.is_set():
        raise ClientGoneError("the request was cancelled")
    if not poller.poll(_POLL_MS) and time.monotonic() - idle_since > stall_seconds:
        raise ClientGoneError(f"no part of the body arrived for {stall_seconds:g} s")


def _drain_pipe(pipe_r: int, fd: int, count: int, offset: int, use_splice: bool) -> tuple[int, bool]:
    """Move ``count`` bytes from the pipe into the file at ``offset``; (new offset, splice still usable)."""
    while count:
        if use_splice:
            try:
                moved = os.splice(pipe_r, fd, count, offset_dst=offset, flags=os.SPLICE_F_MOVE)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                use_splice = False  # a file system without splice_write: copy what is in the pipe
                continue
        else:
            data = os.read(pipe_r, count)
            _pwrite_all(fd, data, offset)
            moved = len(data)
        offset += moved
        count -= moved
    return offset, use_splice


def splice_body(
    body: TakenBody, fd: int, stop: threading.Event, *, offset: int = 0, stall_seconds: float = STALL_SECONDS
) -> int:
    """Write the taken body into the file ``fd`` from ``offset``; the bytes written. Blocks (a thread's work)."""
    start = offset
    if body.pending:
        offset = _pwrite_all(fd, body.pending, offset)
    remaining = body.remaining
    pipe_r, pipe_w = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # over the caller's pipe-size limits: the default pipe
            fcntl.fcntl(pipe_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        capacity = fcntl.fcntl(pipe_w, fcntl.F_GETPIPE_SZ)
        poller = select.poll()
        poller.register(body.fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        use_splice = True
        idle_since = time.monotonic()
        while remaining:
            try:
                # No data yet is BlockingIOError (the pipe is empty here: never a full pipe).
                flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
                count = os.splice(body.fd, pipe_w, min(remaining, capacity), flags=flags)
            except BlockingIOError:
                _wait_readable(poller, stop, idle_since, stall_seconds)
                continue
            except ConnectionError as exc:
                raise ClientGoneError(str(exc)) from exc
            if count == 0:
                raise ClientGoneError(f"the client closed its connection {remaining} bytes before the end of its body")
            idle_since = time.monotonic()
            remaining -= count
            offset, use_splice = _drain_pipe(pipe_r, fd, count, offset, use_splice)
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
    return offset - start


def can_splice() -> bool:
    """Whether a splice may start now (see MAX_SPLICES)."""
    return _active < MAX_SPLICES


async def splice_into(body: TakenBody, fd: int, *, stall_seconds: float = STALL_SECONDS) -> int:
    """``splice_body`` in a worker thread; releases the body when the thread is done, whatever happened.

    Raises ClientGoneError when the client went away (the connection is then closed). The file
    descriptor is not touched once this returns or raises, cancellation included.
    """
    global _active
    stop = threading.Event()
    _active += 1
    work = functools.partial(splice_body, body, fd, stop, stall_seconds=stall_seconds)
    future = asyncio.get_running_loop().run_in_executor(_executor, work)
    aborted = True
    try:
        written = await asyncio.shield(future)
        aborted = False
        return written
    finally:
        if not future.done():
            # Cancelled: the thread stops at its next look at the flag; the caller closes ``fd``
            # after this returns, so the thread must be done with it first.
            stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait((future,))
        _active -= 1
        body.release(aborted=aborted)
