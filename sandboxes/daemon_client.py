"""Asyncio client for the sandbox daemon (see ``sandboxd.protocol`` for the wire format).

Each call opens its own connection, which costs a few tens of microseconds on a unix socket and keeps
cancellation trivial: closing the connection is how a cancelled exec or process stream tells the
daemon to kill its process group. Streaming calls are async iterators, so a slow client never holds a
thread and memory stays bounded by one chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
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

STREAM_LIMIT = 4 * CHUNK_SIZE


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


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """Next frame, or ``None`` when the peer closed cleanly between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("connection closed inside a frame header") from exc
        return None
    kind, length = parse_header(header)
    if length == 0:
        return kind, b""
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("connection closed inside a frame") from exc


def _stream_name(kind: int) -> Literal["stdout", "stderr"]:
    return "stderr" if kind == Kind.DATA2 else "stdout"


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def frame(self) -> tuple[int, bytes]:
        try:
            item = await read_frame(self.reader)
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

    async def send(self, message: dict[str, Any]) -> None:
        try:
            self.writer.write(encode_json(message))
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc

    async def send_data(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.writer.write(HEADER.pack(Kind.DATA, len(data)))
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise DaemonUnavailable(f"connection to the sandbox daemon broke: {exc}") from exc

    def abort(self) -> None:
        # abort() rather than close(): the socket must be gone now, not after a flush, so the daemon
        # notices the cancellation immediately.
        self.writer.transport.abort()


def _check(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("type") == "error":
        raise DaemonError(str(message.get("code", ErrorCode.INTERNAL)), str(message.get("message", "")))
    return message


class FileReader:
    """An open file inside the sandbox: ``size`` is known before the first byte is read."""

    def __init__(self, connection: _Connection, size: int) -> None:
        self._connection = connection
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

    async def aclose(self) -> None:
        if self._finished:
            self._connection.writer.close()
        else:
            self._connection.abort()


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
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.address.unix_path is not None:
                    reader, writer = await asyncio.open_unix_connection(self.address.unix_path, limit=STREAM_LIMIT)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.address.host, self.address.port, limit=STREAM_LIMIT
                    )
        except (OSError, TimeoutError) as exc:
            raise DaemonUnavailable(f"cannot reach the sandbox daemon at {self.address}: {exc}") from exc
        connection = _Connection(reader, writer)
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

    async def exec(
        self,
        command: str,
        *,
        # The command's own limit, enforced by the daemon (which kills the process group), not an
        # asyncio timeout of this call.
        timeout: float | None = None,  # noqa: ASYNC109
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """Events of one command as they happen: started, output chunks, exit.

        Raises ``DaemonError`` before any output for a request the daemon refuses (missing workdir).
        Stopping the iteration early (``aclose``, task cancellation) kills the command's process group.
        """
        async with self._request(
            "exec", command=command, timeout=timeout, workdir=workdir, env=dict(env) if env else None
        ) as connection:
            while True:
                kind, payload = await connection.frame()
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
