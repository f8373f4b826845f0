"""Asyncio client for the sandbox daemon (see ``sandboxd.protocol`` for the wire format).

Each call opens its own connection, which costs a few tens of microseconds on a unix socket and keeps
cancellation trivial: closing the connection is how a cancelled exec or process stream tells the
daemon to kill its process group. Streaming calls are async iterators, so a slow client never holds a
thread and memory stays bounded by one chunk.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from sandboxd.protocol import (
    CHUNK_SIZE,
    HEADER,
    PROTOCOL_VERSION,
    ErrorCode,
    Kind,
    ProtocolError,
    TextDecoder,
    decode_json,
    encode_json,
    parse_header,
)
from sandboxes.runtimes.base import DaemonAddress

__all__ = [
    "DaemonClient",
    "DaemonError",
    "DaemonUnavailable",
    "DescriptorFileReader",
    "ErrorCode",
    "ExecExit",
    "ExecOutput",
    "ExecResult",
    "ExecStarted",
    "FileReader",
    "PendingExchange",
    "ProcessStream",
    "TextDecoder",
    "WriteResult",
]

RECV_BUFFER = 2 * CHUNK_SIZE + HEADER.size
# Below this, header and payload go out in one send; above, two sends beat copying the payload.
SMALL_FRAME = 64 * 1024
SEND_BUFFER = 4 * 1024 * 1024


class DaemonError(Exception):
    """The daemon refused or failed a request; ``code`` is one of ``ErrorCode``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonUnavailable(DaemonError):  # noqa: N818 - a condition of the sandbox, not of the call
    """The daemon could not be reached or the connection broke mid-request (the sandbox is gone)."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


@dataclass(frozen=True)
class ExecStarted:
    pid: int


@dataclass(frozen=True)
class ExecOutput:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExecExit:
    exit_code: int
    timed_out: bool = False
    signal: str | None = None


ExecEvent = ExecStarted | ExecOutput | ExecExit


@dataclass(frozen=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int
    timed_out: bool

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@runtime_checkable
class SpliceableBody(Protocol):
    """A body to write that may be able to move itself into the file (a request's socket spliced
    into it, see common.zerocopy): the bytes written, or None to be iterated instead."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def splice_into(self, fd: int) -> int | None: ...


@dataclass(frozen=True)
class WriteResult:
    path: str
    size: int


def _stream_name(kind: int) -> Literal["stdout", "stderr"]:
    return "stderr" if kind == Kind.DATA2 else "stdout"


# Receive buffers kept between connections: a new one is zero-filled (2 MiB of page faults), which
# cost a short exec more than its messages. A handful cover the requests in flight at once.
_spare_buffers: list[bytearray] = []
SPARE_BUFFERS = 16


def _take_buffer() -> bytearray:
    try:
        return _spare_buffers.pop()  # atomic: connections of other threads' loops share the list
    except IndexError:
        return bytearray(RECV_BUFFER)


def _give_back_buffer(buffer: bytearray) -> None:
    if len(buffer) == RECV_BUFFER and len(_spare_buffers) < SPARE_BUFFERS:
        _spare_buffers.append(buffer)


# Connections to local daemons kept after a command, for the next one: the daemon serves further
# requests on a connection after an exec (sandboxd's REUSABLE_OPS), and a kept one spares the next
# command a connect, the daemon's accept and its hand-over to a worker thread. A few per daemon
# (each holds one of the daemon's threads), given up long before the daemon's own limit
# (IDLE_CONNECTION_SECONDS), so a daemon never closes one just as a request goes out on it. Only unix
# sockets: a TCP peer that died goes unnoticed until a request waits in vain.
KEPT_OPS = frozenset({"exec"})
KEPT_PER_DAEMON = 4
KEPT_SECONDS = 15.0
_kept: dict[tuple[str, str], list[tuple[socket.socket, float]]] = {}
_kept_lock = threading.Lock()
_kept_pruned = 0.0


def _prune_kept(now: float) -> None:
    """Close kept connections past KEPT_SECONDS (those of destroyed sandboxes among them); under the lock."""
    global _kept_pruned
    if now - _kept_pruned < 1.0:
        return
    _kept_pruned = now
    for key, idle in list(_kept.items()):
        fresh = []
        for sock, since in idle:
            if now - since < KEPT_SECONDS:
                fresh.append((sock, since))
            else:
                sock.close()
        if fresh:
            _kept[key] = fresh
        else:
            del _kept[key]


def _take_kept(key: tuple[str, str]) -> socket.socket | None:
    now = time.monotonic()
    with _kept_lock:
        _prune_kept(now)
        idle = _kept.get(key)
        while idle:
            sock, since = idle.pop()
            if now - since < KEPT_SECONDS and _idle_and_open(sock):
                return sock
            sock.close()
    return None


def _idle_and_open(sock: socket.socket) -> bool:
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True  # nothing to read and not closed: the daemon is waiting for a request
    except OSError:
        return False
    return False  # closed by the daemon (it stopped), or bytes nobody asked for


def _keep(key: tuple[str, str], sock: socket.socket) -> bool:
    now = time.monotonic()
    with _kept_lock:
        _prune_kept(now)
        idle = _kept.setdefault(key, [])
        if len(idle) >= KEPT_PER_DAEMON:
            return False
        idle.append((sock, now))
        return True


def forget_kept(unix_path: str | None = None) -> None:
    """Close the kept connections to the daemon at ``unix_path`` (its sandbox is being destroyed), or
    all of them."""
    with _kept_lock:
        for key in [key for key in _kept if unix_path is None or key[0] == unix_path]:
            for sock, _since in _kept.pop(key):
                sock.close()


def _forget_kept_in_child() -> None:
    # A forked child must not share its parent's connections. Closed, not shut down: that would
    # end the parent's too.
    global _kept_lock
    _kept_lock = threading.Lock()
    for idle in _kept.values():
        for sock, _since in idle:
            sock.close()
    _kept.clear()


os.register_at_fork(after_in_child=_forget_kept_in_child)


class _Connection:
    """A raw non-blocking socket speaking frames.

    Frames are parsed out of one reusable receive buffer filled with ``sock_recv_into``: each payload
    is copied exactly once, where asyncio streams would copy it twice and shift their buffer on
    every read, which caps throughput well below what the socket delivers.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._buffer = _take_buffer()
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._closed = False
        self._receiving = False
        # Where the socket goes back after a finished request (a local daemon's reusable op).
        self.keep_as: tuple[str, str] | None = None

    async def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available from ``_start``; False on a clean EOF with nothing pending."""
        while self._end - self._start < need:
            if self._start and need > len(self._buffer) - self._start:
                # Move the partial frame to the front to make room for the rest of it.
                pending = self._end - self._start
                self._buffer[:pending] = bytes(self._view[self._start : self._end])
                self._start, self._end = 0, pending
            if need > len(self._buffer):
                # Only an unusually large control message gets here.
                bigger = bytearray(need)
                bigger[: self._end] = self._view[: self._end]
                self._buffer, self._view = bigger, memoryview(bigger)
            self._receiving = True
            try:
                received = await self._loop.sock_recv_into(self.sock, self._view[self._end :])
            finally:
                self._receiving = False
            if received == 0:
                return False
            self._end += received
        return True

    async def read(self) -> tuple[int, bytes] | None:
        try:
            if not await self._fill(HEADER.size):
                if self._end != self._start:
                    raise ProtocolError("connection closed inside a frame header")
                return None
            kind, length = parse_header(self._view[self._start : self._start + HEADER.size])
            self._start += HEADER.size
            if length and not await self._fill(length):
                raise ProtocolError("connection closed inside a frame")
            payload = bytes(self._view[self._start : self._start + length])
            self._start += length
            if self._start == self._end:
                self._start = self._end = 0
            return kind, payload
        except ProtocolError:
            raise
        except OSError as exc:
            raise ConnectionError(str(exc)) from exc

    async def message_with_fd(self) -> tuple[dict[str, Any], int | None]:
        """The next message, and the descriptor sent along with it (SCM_RIGHTS) if any.

        Only for a message that starts the conversation's answers (nothing buffered before it): the
        descriptor arrives with the first byte of the message that carries it.
        """
        if self._end != self._start:
            raise DaemonUnavailable("unexpected data from the sandbox daemon")
        self._start = self._end = 0
        while True:
            try:
                received, ancillary, _flags, _ = self.sock.recvmsg_into(
                    [self._view], socket.CMSG_SPACE(array.array("i").itemsize), socket.MSG_CMSG_CLOEXEC
                )
                break
            except BlockingIOError:
                await self._readable()
            except OSError as exc:
                raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[: len(data) - len(data) % array.array("i").itemsize]))
        self._end = received
        try:
            if received == 0:
                raise DaemonUnavailable("the sandbox daemon closed the connection")
            return await self.message(), (fds.pop(0) if fds else None)
        finally:
            for extra in fds:
                os.close(extra)

    async def answer(self, *, with_fd: bool) -> tuple[dict[str, Any], int | None]:
        """The first message of the daemon's answer, with the descriptor it carries if asked for."""
        if with_fd:
            return await self.message_with_fd()
        return await self.message(), None

    async def _readable(self) -> None:
        waiter = self._loop.create_future()
        self._loop.add_reader(self.sock.fileno(), waiter.set_result, None)
        try:
            await waiter
        finally:
            self._loop.remove_reader(self.sock.fileno())

    async def frame(self) -> tuple[int, bytes]:
        try:
            item = await self.read()
        except (ProtocolError, ConnectionError) as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc
        if item is None:
            raise DaemonUnavailable("the sandbox daemon closed the connection")
        return item

    async def message(self) -> dict[str, Any]:
        kind, payload = await self.frame()
        if kind != Kind.JSON:
            raise DaemonUnavailable("unexpected data from the sandbox daemon")
        return _check(decode_json(payload))

    async def _sendall(self, data: bytes | bytearray | memoryview) -> None:
        try:
            # Most messages fit the socket's buffer whole: sent here, without the loop's machinery.
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc
        if sent == len(data):
            return
        try:
            await self._loop.sock_sendall(self.sock, memoryview(data)[sent:])
        except OSError as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc

    async def send(self, message: dict[str, Any]) -> None:
        await self._sendall(encode_json(message))

    async def send_data(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) <= SMALL_FRAME:
            await self._sendall(HEADER.pack(Kind.DATA, len(data)) + bytes(data))
        else:
            await self._sendall(HEADER.pack(Kind.DATA, len(data)))
            await self._sendall(data)

    def finish(self) -> None:
        """The request was answered to its end: keep the connection for the next one, if it may be."""
        if self._closed:
            return
        if self.keep_as is None or self._receiving or self._end != self._start:
            self.abort()
            return
        self._closed = True
        if not _keep(self.keep_as, self.sock):
            self.sock.close()
        self._release_buffer()

    def abort(self) -> None:
        # Immediately, without flushing: the daemon must notice a cancellation at once.
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._release_buffer()

    def _release_buffer(self) -> None:
        buffer, self._buffer = self._buffer, bytearray()
        self._view = memoryview(self._buffer)
        self._start = self._end = 0
        if not self._receiving:
            # Reused only when no receive into it can still be under way (a task aborting
            # another's connection).
            _give_back_buffer(buffer)


def _check(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("type") == "error":
        raise DaemonError(str(message.get("code", ErrorCode.INTERNAL)), str(message.get("message", "")))
    return message


class _OneRequest:
    """What one request to the daemon answers; ``aclose`` ends its connection (at once, unflushed)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def aclose(self) -> None:
        self._connection.abort()


class FileReader(_OneRequest):
    """An open file inside the sandbox: ``size`` is known before the first byte is read."""

    def __init__(self, connection: _Connection, size: int) -> None:
        super().__init__(connection)
        self.size = size
        self.received = 0
        self._finished = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                kind, payload = await self._connection.frame()
                if kind == Kind.DATA:
                    self.received += len(payload)
                    yield payload
                    continue
                message = _check(decode_json(payload))
                if message.get("type") == "done":
                    self._finished = True
                    return
        finally:
            await self.aclose()


async def _pieces(data: bytes | AsyncIterable[bytes] | Iterable[bytes]) -> AsyncIterator[bytes | memoryview]:
    """What a write sends, piece by piece: whole bytes in CHUNK_SIZE slices, iterables as they come
    (empty pieces skipped)."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_SIZE):
            yield view[start : start + CHUNK_SIZE]
    elif isinstance(data, AsyncIterable):
        async for piece in data:
            if piece:
                yield piece
    else:
        for piece in data:
            if piece:
                yield piece


def _pwrite_all(fd: int, pieces: list[bytes | memoryview], offset: int) -> None:
    views = [memoryview(piece) for piece in pieces]
    while views:
        written = os.pwritev(fd, views, offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


async def _write_to_descriptor(fd: int, data: bytes | AsyncIterable[bytes] | Iterable[bytes]) -> int:
    """Write ``data`` to a file the daemon handed over; the bytes written.

    Pieces are gathered into writes of about CHUNK_SIZE, each in a worker thread (a write can wait
    for the disk) while the next pieces arrive; at most one write is in flight, so memory stays
    bounded by two batches.
    """
    loop = asyncio.get_running_loop()
    if not fd_is_regular(fd):
        raise DaemonUnavailable("the sandbox daemon handed over something other than a regular file")
    if isinstance(data, SpliceableBody):
        spliced = await data.splice_into(fd)
        if spliced is not None:
            return spliced
    offset = 0
    batch: list[bytes | memoryview] = []
    batched = 0
    writing: asyncio.Future[None] | None = None

    async def flush() -> None:
        nonlocal writing, batch, batched, offset
        if writing is not None:
            await writing
            writing = None
        if batch:
            writing = loop.run_in_executor(None, _pwrite_all, fd, batch, offset)
            offset += batched
            batch, batched = [], 0

    try:
        async for piece in _pieces(data):
            batch.append(piece)
            batched += len(piece)
            if batched >= CHUNK_SIZE:
                await flush()
        await flush()
        await flush()  # the last batch's write itself
    finally:
        if writing is not None:
            # The descriptor is closed after this: no thread may still be writing to it.
            with contextlib.suppress(Exception):
                await asyncio.shield(writing)
    return offset


def fd_is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


class DescriptorFileReader:
    """A file the daemon opened inside the sandbox and handed over (local runtime, unix socket): read
    here, so its bytes are not relayed through the daemon. Same interface as ``FileReader``."""

    def __init__(self, fd: int, size: int) -> None:
        if not fd_is_regular(fd):
            os.close(fd)
            raise DaemonUnavailable("the sandbox daemon handed over something other than a regular file")
        self._fd = fd
        self._pending: asyncio.Future[bytes] | None = None
        self.size = size
        self.received = 0

    @property
    def fd(self) -> int:
        """The open file (-1 once closed); closed by ``aclose``."""
        return self._fd

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    def _read_next(self) -> asyncio.Future[bytes] | None:
        if self.received >= self.size or self._fd < 0:
            return None
        # In a worker thread: a file not in the page cache must not stall the event loop.
        length = min(CHUNK_SIZE, self.size - self.received)
        return asyncio.get_running_loop().run_in_executor(None, os.pread, self._fd, length, self.received)

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            self._pending = self._read_next()
            while self._pending is not None:
                chunk = await self._pending
                self._pending = None
                if not chunk:
                    return  # truncated since it was opened: the body ends short
                self.received += len(chunk)
                # The next read runs while this chunk is being sent.
                self._pending = self._read_next()
                yield chunk
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            # Closed only once no thread can still be reading it (the number could be reused).
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ExecStream(_OneRequest):
    """The events of one command sent to the daemon. ``aclose`` (also when never iterated) ends the
    connection, which kills the command's process group if it still runs."""

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ExecEvent]:
        try:
            while True:
                kind, payload = await self._connection.frame()
                if kind != Kind.JSON:
                    yield ExecOutput(_stream_name(kind), payload)
                    continue
                message = _check(decode_json(payload))
                kind_name = message.get("type")
                if kind_name == "started":
                    yield ExecStarted(int(message["pid"]))
                elif kind_name == "exit":
                    # Answered to its end: the connection can carry the next command.
                    self._connection.finish()
                    yield ExecExit(int(message["exitCode"]), bool(message.get("timedOut")), message.get("signal"))
                    return
        finally:
            await self.aclose()


class ProcessStream:
    """A bidirectional process (terminal, ``sshd -i``) inside the sandbox."""

    def __init__(self, connection: _Connection, pid: int) -> None:
        self._connection = connection
        self.pid = pid
        self.exit: ExecExit | None = None

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_SIZE):
            await self._connection.send_data(view[start : start + CHUNK_SIZE])

    async def resize(self, cols: int, rows: int) -> None:
        await self._connection.send({"type": "resize", "cols": cols, "rows": rows})

    async def signal(self, name: str) -> None:
        await self._connection.send({"type": "signal", "signal": name.removeprefix("SIG")})

    async def close_stdin(self) -> None:
        await self._connection.send({"type": "eof"})

    def __aiter__(self) -> AsyncIterator[ExecOutput | ExecExit]:
        return self._events()

    async def _events(self) -> AsyncIterator[ExecOutput | ExecExit]:
        while self.exit is None:
            kind, payload = await self._connection.frame()
            if kind != Kind.JSON:
                yield ExecOutput(_stream_name(kind), payload)
                continue
            message = _check(decode_json(payload))
            if message.get("type") == "exit":
                self.exit = ExecExit(int(message["exitCode"]), bool(message.get("timedOut")), message.get("signal"))
                yield self.exit

    async def aclose(self) -> None:
        """Hang up: the daemon sends SIGHUP, then SIGKILL, to the process group if it still runs."""
        self._connection.abort()

    async def __aenter__(self) -> ProcessStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class PendingExchange:
    """A background exchange the daemon took on: its outcome is the connection's next message."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def _receive(self, size: int) -> bytes:
        chunks: list[bytes] = []
        while size:
            chunk = self._sock.recv(size)
            if not chunk:
                raise DaemonUnavailable("the sandbox daemon closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc

    def message(self, timeout: float) -> dict[str, Any]:
        """The next message (blocking, at most ``timeout`` seconds of silence); errors raise DaemonError."""
        self._sock.settimeout(timeout)
        try:
            kind, length = parse_header(self._receive(HEADER.size))
            payload = self._receive(length)
        except (OSError, ProtocolError) as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc
        if kind != Kind.JSON:
            raise DaemonUnavailable("unexpected data from the sandbox daemon")
        return _check(decode_json(payload))

    def accepted(self, timeout: float) -> None:
        """Wait until the daemon took the exchange on (it holds new commands from then on)."""
        try:
            answer = self.message(timeout)
        except BaseException:
            self.close()
            raise
        if answer.get("type") != "accepted":
            self.close()
            raise DaemonUnavailable("the sandbox daemon did not accept a background exchange")

    def outcome(self, timeout: float) -> dict[str, Any]:
        """Wait for the exchange's answer (``{"type": "ok", "expiresIn", "tokenPrefix"}``), then close."""
        try:
            return self.message(timeout)
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


class DaemonClient:
    def __init__(self, address: DaemonAddress, secret: str, *, connect_timeout: float = 5.0) -> None:
        self.address = address
        self.secret = secret
        self.connect_timeout = connect_timeout

    async def _open(self, op: str, **fields: Any) -> _Connection:
        request = {"v": PROTOCOL_VERSION, "op": op, "secret": self.secret, **fields}
        unix_path = self.address.unix_path
        keep_as = (unix_path, self.secret) if op in KEPT_OPS and unix_path is not None else None
        while keep_as is not None and (sock := _take_kept(keep_as)) is not None:
            connection = _Connection(sock)
            try:
                await connection.send(request)
            except DaemonUnavailable:
                connection.abort()  # gone meanwhile (its sandbox stopped): the next one, or a new one
                continue
            except BaseException:
                connection.abort()
                raise
            connection.keep_as = keep_as
            return connection
        connection = await self._connect()
        try:
            await connection.send(request)
        except BaseException:
            connection.abort()
            raise
        connection.keep_as = keep_as
        return connection

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.address.unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = self.address.unix_path
        else:
            infos = await loop.getaddrinfo(self.address.host, self.address.port, type=socket.SOCK_STREAM)
            family, _, _, _, target = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        # A deep send queue lets this side keep relaying (an upload, say) while the daemon is busy
        # writing what it already has, instead of the two taking turns. The kernel caps the value
        # (net.core.wmem_max) and only commits memory for what is actually queued.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            try:
                # A unix socket connects at once unless the daemon's backlog is full; only then is
                # the event loop's wait (and its timeout) needed.
                if self.address.unix_path is None:
                    raise BlockingIOError
                sock.connect(target)
            except BlockingIOError:
                async with asyncio.timeout(self.connect_timeout):
                    await loop.sock_connect(sock, target)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, OSError | TimeoutError):
                raise DaemonUnavailable(f"cannot reach the sandbox daemon at {self.address}: {exc}") from exc
            raise
        return _Connection(sock)

    @contextlib.asynccontextmanager
    async def _request(self, op: str, **fields: Any) -> AsyncIterator[_Connection]:
        connection = await self._open(op, **fields)
        try:
            yield connection
        finally:
            connection.abort()

    async def ping(self) -> dict[str, Any]:
        async with self._request("ping") as connection:
            return await connection.message()

    async def update_credentials(self, env: Mapping[str, str], config: Mapping[str, Any] | None = None) -> None:
        """Replace the variables every later exec sees and (re)write ``~/.svc.config``."""
        async with self._request(
            "credentials", env=dict(env), config=dict(config) if config is not None else None
        ) as c:
            await c.message()

    def send_exchange(
        self,
        *,
        url: str,
        identity_token: str,
        base_url: str,
        config: Mapping[str, Any] | None = None,
        timeout: float = 5.0,
    ) -> PendingExchange:
        """Have the sandbox authenticate itself: the daemon calls the token exchange from inside.

        Blocking (no event loop: a create calls it from its worker thread, where starting one would
        cost more than the call), and without waiting for the daemon's answer: the caller goes on with
        its own work meanwhile and reads it with ``accepted``, from when the daemon holds new
        commands until the token is installed. The exchange's outcome is read after that.
        """
        pending = PendingExchange(self._connect_blocking(timeout))
        try:
            pending.send(
                encode_json(
                    {
                        "v": PROTOCOL_VERSION,
                        "op": "exchange",
                        "secret": self.secret,
                        "url": url,
                        "identityToken": identity_token,
                        "baseUrl": base_url,
                        "config": dict(config or {}),
                        "background": True,
                    }
                )
            )
        except BaseException:
            pending.close()
            raise
        return pending

    def _connect_blocking(self, timeout: float) -> socket.socket:
        try:
            if self.address.unix_path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                try:
                    sock.connect(self.address.unix_path)
                except BaseException:
                    sock.close()
                    raise
                return sock
            assert self.address.host is not None and self.address.port is not None
            sock = socket.create_connection((self.address.host, self.address.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            raise DaemonUnavailable(f"cannot reach the sandbox daemon at {self.address}: {exc}") from exc

    async def start_exec(
        self,
        command: str,
        *,
        # The command's own limit, enforced by the daemon (which kills the process group), not an
        # asyncio timeout of this call.
        timeout: float | None = None,  # noqa: ASYNC109
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecStream:
        """Send a command to the daemon; its events follow from the returned stream.

        Raises ``DaemonUnavailable`` here when the daemon cannot be reached, before anything ran.
        """
        connection = await self._open(
            "exec", command=command, timeout=timeout, workdir=workdir, env=dict(env) if env else None
        )
        return ExecStream(connection)

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's limit, see start_exec()
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """Events of one command as they happen: started, output chunks, exit.

        Raises ``DaemonError`` before any output for a request the daemon refuses (missing workdir).
        Stopping the iteration early (``aclose``, task cancellation) kills the command's process group.
        """
        stream = await self.start_exec(command, timeout=timeout, workdir=workdir, env=env)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's limit, see exec()
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run a command to completion and collect its output (for short outputs)."""
        out: list[bytes] = []
        err: list[bytes] = []
        exit_event = ExecExit(-1)
        async for event in self.exec(command, timeout=timeout, workdir=workdir, env=env):
            if isinstance(event, ExecOutput):
                (out if event.stream == "stdout" else err).append(event.data)
            elif isinstance(event, ExecExit):
                exit_event = event
        return ExecResult(b"".join(out), b"".join(err), exit_event.exit_code, exit_event.timed_out)

    def _passes_fds(self, pass_fd: bool | None) -> bool:
        """Whether to ask the daemon for the file itself: by default when it is on this machine."""
        return self.address.unix_path is not None if pass_fd is None else pass_fd

    async def open_file(self, path: str, *, pass_fd: bool | None = None) -> FileReader | DescriptorFileReader:
        """Open a file for streaming; errors (missing, directory, relative path) raise here.

        Over a unix socket (the daemon runs on this machine) the daemon hands over the open file
        and it is read here directly; otherwise (or with ``pass_fd=False``) its bytes come through
        the daemon.
        """
        local = self._passes_fds(pass_fd)
        connection = await self._open("read", path=path, passFd=local)
        try:
            message, fd = await connection.answer(with_fd=local)
        except BaseException:
            connection.abort()
            raise
        size = int(message.get("size", 0))
        if fd is None:
            return FileReader(connection, size)
        connection.abort()  # nothing else comes over it
        return DescriptorFileReader(fd, size)

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        reader = await self.open_file(path)
        async for chunk in reader:
            yield chunk

    async def write_file(
        self,
        path: str,
        data: bytes | AsyncIterable[bytes] | Iterable[bytes],
        *,
        mode: int | None = None,
        pass_fd: bool | None = None,
    ) -> WriteResult:
        """Write a file atomically (temp file + rename), creating missing parent directories.

        Over a unix socket the daemon hands over its temporary file and it is written here
        directly (``pass_fd``, as for ``open_file``); the daemon still creates and commits it.
        """
        local = self._passes_fds(pass_fd)
        async with self._request("write", path=path, mode=mode, passFd=local) as connection:
            # "ready", or the error for a bad path
            _ready, fd = await connection.answer(with_fd=local)
            if fd is not None:
                try:
                    written = await _write_to_descriptor(fd, data)
                finally:
                    os.close(fd)
                await connection.send({"type": "end", "size": written})
                message = await connection.message()
                return WriteResult(str(message.get("path", path)), int(message.get("size", 0)))
            sending = asyncio.ensure_future(self._send_chunks(connection, data))
            try:
                await sending
            except DaemonUnavailable:
                # The daemon stopped reading, most likely because it failed; its reply says why.
                await connection.message()
                raise
            message = await connection.message()
            return WriteResult(str(message.get("path", path)), int(message.get("size", 0)))

    @staticmethod
    async def _send_chunks(connection: _Connection, data: bytes | AsyncIterable[bytes] | Iterable[bytes]) -> None:
        async for piece in _pieces(data):
            await connection.send_data(piece)
        await connection.send({"type": "end"})

    async def open_process(
        self,
        argv: list[str] | None = None,
        *,
        command: str | None = None,
        pty: bool = False,
        cols: int = 80,
        rows: int = 24,
        term: str = "xterm-256color",
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessStream:
        """Start an interactive process; without ``argv`` or ``command`` it is a login shell."""
        connection = await self._open(
            "process",
            argv=argv,
            command=command,
            pty=pty,
            cols=cols,
            rows=rows,
            term=term,
            workdir=workdir,
            env=dict(env) if env else None,
        )
        try:
            message = await connection.message()
        except BaseException:
            connection.abort()
            raise
        return ProcessStream(connection, int(message["pid"]))
