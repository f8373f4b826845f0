"""Request and response bodies moved between the client's socket and a file by the kernel.

An upload relayed through ASGI reaches the view as Python objects: the server copies each read of
the socket into bytes, the HTTP parser copies the body out of those, the server buffers and copies
it again for ``receive``, and the view copies it into the file, with an event-loop round per 64 KiB.
A download makes the same trip the other way. For a 1 GiB write-file or read-file that was most of
the web process's time. The service's HTTP protocol (``common.http_server``) offers two ASGI scope
extensions instead:

- ``BODY_SOCKET``: a request's socket, handed over; the body then goes socket → pipe → file with
  ``splice(2)``, which the kernel does by moving page references and one copy into the page cache.
- ``SEND_FILE``: a response body sent from an open file with ``sendfile(2)``, straight from the
  page cache.

Both run in worker threads (the socket is the server's, and a file can wait for the disk). A server
without them (daphne, the test client, uvicorn's own protocols) simply does not offer them, and
bodies go through ``receive`` and ``send`` as before. See docs/sandboxes.md ("How file bytes reach
the socket").
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
from collections.abc import Callable
from typing import Protocol

# The ASGI scope extensions (scope["extensions"][...]): a request's socket, and sending a file.
BODY_SOCKET = "svc.body_socket"
SEND_FILE = "svc.send_file"

# Below this many bytes still to come, a splice is not worth a thread and the connection's
# keep-alive (a connection whose body was spliced is closed after its response).
MIN_SPLICE_BYTES = 1024 * 1024
# Bodies spliced or sent at once. Each holds a worker thread while its client sends or reads;
# bodies beyond this go through receive() and send() as usual, so slow clients can never take
# every thread.
MAX_TRANSFERS = 8
# A client that sends (or reads) no byte of a body for this long is dropped (its connection
# closed); the service's setting FILE_TRANSFER_STALL_SECONDS.
STALL_SECONDS = 120.0
# The pipe between socket and file: the most one splice moves. 1 MiB is the kernel's default
# limit for unprivileged processes; a smaller pipe only means more, smaller splices.
PIPE_BYTES = 1024 * 1024
# How often a waiting transfer looks at its stop flag (a cancelled request, a stall).
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


class FileSender(Protocol):
    """What the scope's ``SEND_FILE`` extension holds."""

    # Bytes of files sent so far by ``send_file`` for this request, those of an interrupted one included.
    sent: int

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        """Send ``count`` bytes of the file ``fd`` from ``offset`` as (part of) the response body,
        after ``http.response.start`` (with a Content-Length that covers them); the bytes sent.
        Fewer than ``count`` (the file shrank since) closes the connection: the body cannot be
        completed. Raises ClientGoneError when the client went away."""


class ClientGoneError(Exception):
    """The client closed its connection, or stalled, before a body was through."""


_executor = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_TRANSFERS, thread_name_prefix="zerocopy")
_active = 0  # transfers running; only touched from the event loop


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]
    return offset


def _wait_ready(poller: select.poll, stop: threading.Event, idle_since: float, stall_seconds: float) -> None:
    if stop.is_set():
        raise ClientGoneError("the request was cancelled")
    if not poller.poll(_POLL_MS) and time.monotonic() - idle_since > stall_seconds:
        raise ClientGoneError(f"no part of the body went through for {stall_seconds:g} s")


def _when_ready(
    operation: Callable[[], int], poller: select.poll, stop: threading.Event, idle_since: float, stall_seconds: float
) -> int | None:
    """``operation()`` on the non-blocking socket; None once it would block and the socket is ready
    (or a while passed). A broken connection, a stall or ``stop`` is ClientGoneError."""
    try:
        return operation()
    except BlockingIOError:
        _wait_ready(poller, stop, idle_since, stall_seconds)
        return None
    except ConnectionError as exc:
        raise ClientGoneError(str(exc)) from exc


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
            # No data yet is BlockingIOError (the pipe is empty here: never a full pipe).
            flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
            count = _when_ready(
                functools.partial(os.splice, body.fd, pipe_w, min(remaining, capacity), flags=flags),
                poller,
                stop,
                idle_since,
                stall_seconds,
            )
            if count is None:
                continue
            if count == 0:
                raise ClientGoneError(f"the client closed its connection {remaining} bytes before the end of its body")
            idle_since = time.monotonic()
            remaining -= count
            offset, use_splice = _drain_pipe(pipe_r, fd, count, offset, use_splice)
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
    return offset - start


def send_file(
    sock_fd: int,
    fd: int,
    offset: int,
    count: int,
    stop: threading.Event,
    progress: list[int],
    *,
    stall_seconds: float = STALL_SECONDS,
) -> int:
    """Send ``count`` bytes of the file ``fd`` from ``offset`` to the socket; the bytes sent, fewer
    if the file ends first. ``progress[0]`` follows along. Blocks (a thread's work)."""
    poller = select.poll()
    poller.register(sock_fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    sent = 0
    idle_since = time.monotonic()
    while sent < count:
        # The socket is non-blocking (the server's): a full socket buffer is BlockingIOError.
        moved = _when_ready(
            functools.partial(os.sendfile, sock_fd, fd, offset + sent, min(count - sent, PIPE_BYTES * 4)),
            poller,
            stop,
            idle_since,
            stall_seconds,
        )
        if moved is None:
            continue
        if moved == 0:
            break  # the file is shorter than when it was opened
        sent += moved
        progress[0] = sent
        idle_since = time.monotonic()
    return sent


def can_transfer() -> bool:
    """Whether a splice or a file send may start now (see MAX_TRANSFERS)."""
    return _active < MAX_TRANSFERS


async def in_thread(work: Callable[[threading.Event], int]) -> int:
    """``work(stop)`` in a worker thread, counted against MAX_TRANSFERS.

    When cancelled, ``stop`` is set and this waits for the thread before the cancellation goes on:
    the caller closes the descriptors the thread uses once this returns or raises.
    """
    global _active
    stop = threading.Event()
    _active += 1
    future = asyncio.get_running_loop().run_in_executor(_executor, work, stop)
    try:
        return await asyncio.shield(future)
    finally:
        if not future.done():
            # The thread stops at its next look at the flag.
            stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait((future,))
        _active -= 1


async def splice_into(body: TakenBody, fd: int, *, stall_seconds: float = STALL_SECONDS) -> int:
    """``splice_body`` in a worker thread; releases the body when the thread is done, whatever happened.

    Raises ClientGoneError when the client went away (the connection is then closed). The file
    descriptor is not touched once this returns or raises, cancellation included.
    """
    aborted = True
    try:
        written = await in_thread(lambda stop: splice_body(body, fd, stop, stall_seconds=stall_seconds))
        aborted = False
        return written
    finally:
        body.release(aborted=aborted)
