"""Asyncio client for the sandbox daemon (see ``sandboxd.protocol`` for the wire format).

Each call opens its own connection, which costs a few tens of microseconds on a unix socket and keeps
cancellation trivial: closing the connection is how a cancelled exec or process stream tells the
daemon to kill its process group. Streaming calls are async iterators, so a slow client never holds a
thread and memory stays bounded by one chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
    "ErrorCode",
    "ExecExit",
    "ExecOutput",
    "ExecResult",
    "ExecStarted",
    "FileReader",
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


@dataclass(frozen=True)
class WriteResult:
    path: str
    size: int


def _stream_name(kind: int) -> Literal["stdout", "stderr"]:
    return "stderr" if kind == Kind.DATA2 else "stdout"


class _Connection:
    """A raw non-blocking socket speaking frames.

    Frames are parsed out of one reusable receive buffer filled with ``sock_recv_into``: each payload
    is copied exactly once, where asyncio streams would copy it twice and shift their buffer on
    every read, which caps throughput well below what the socket delivers.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._closed = False

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
            received = await self._loop.sock_recv_into(self.sock, self._view[self._end :])
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
            await self._loop.sock_sendall(self.sock, data)
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

    def abort(self) -> None:
        # Immediately, without flushing: the daemon must notice a cancellation at once.
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


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


class DaemonClient:
    def __init__(self, address: DaemonAddress, secret: str, *, connect_timeout: float = 5.0) -> None:
        self.address = address
        self.secret = secret
        self.connect_timeout = connect_timeout

    async def _open(self, op: str, **fields: Any) -> _Connection:
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
            async with asyncio.timeout(self.connect_timeout):
                await loop.sock_connect(sock, target)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, OSError | TimeoutError):
                raise DaemonUnavailable(f"cannot reach the sandbox daemon at {self.address}: {exc}") from exc
            raise
        connection = _Connection(sock)
        try:
            await connection.send({"v": PROTOCOL_VERSION, "op": op, "secret": self.secret, **fields})
        except BaseException:
            connection.abort()
            raise
        return connection

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

    async def exchange_credentials(
        self,
        *,
        url: str,
        identity_token: str,
        base_url: str,
        config: Mapping[str, Any] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Have the sandbox authenticate itself: the daemon calls the token exchange from inside.

        With ``on_accepted``, the exchange runs in the background of the sandbox: ``on_accepted`` is
        called as soon as the daemon holds new commands for it, and this call still returns (or
        raises) with the exchange's outcome.
        """
        fields: dict[str, Any] = {"url": url, "identityToken": identity_token, "baseUrl": base_url}
        async with self._request(
            "exchange", **fields, config=dict(config or {}), background=on_accepted is not None
        ) as connection:
            if on_accepted is not None:
                accepted = await connection.message()
                if accepted.get("type") != "accepted":
                    raise DaemonUnavailable("the sandbox daemon did not accept a background exchange")
                on_accepted()
            return await connection.message()

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

    async def open_file(self, path: str) -> FileReader:
        """Open a file for streaming; errors (missing, directory, relative path) raise here."""
        connection = await self._open("read", path=path)
        try:
            message = await connection.message()
        except BaseException:
            connection.abort()
            raise
        return FileReader(connection, int(message.get("size", 0)))

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
    ) -> WriteResult:
        """Write a file atomically (temp file + rename), creating missing parent directories."""
        async with self._request("write", path=path, mode=mode) as connection:
            await connection.message()  # "ready", or the error for a bad path
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
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            for start in range(0, len(view), CHUNK_SIZE):
                await connection.send_data(view[start : start + CHUNK_SIZE])
        elif isinstance(data, AsyncIterable):
            async for chunk in data:
                if chunk:
                    await connection.send_data(chunk)
        else:
            for chunk in data:
                if chunk:
                    await connection.send_data(chunk)
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
