"""Splicing a request body from a real loopback TCP socket into a real file (common.zerocopy)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import zerocopy
from common.zerocopy import ClientGoneError, send_file, splice_body, splice_into


class _Taken:
    """A body as a server hands it over: a duplicate of the connection's socket, the bytes the
    server had already read, and how many are still to come."""

    def __init__(self, sock: socket.socket, pending: bytes, remaining: int) -> None:
        self.fd = os.dup(sock.fileno())
        self.pending = pending
        self.remaining = remaining
        self.released: list[bool] = []

    def release(self, *, aborted: bool) -> None:
        os.close(self.fd)
        self.released.append(aborted)


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client, server side) of a loopback TCP connection; the server side non-blocking, as a server's is."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    with client, server:
        yield client, server


def _send_in_background(
    sock: socket.socket, data: bytes, *, close: bool = False, pause: float = 0.0
) -> threading.Thread:
    def send() -> None:
        view = memoryview(data)
        step = max(1, len(data) // 8)
        for start in range(0, len(data), step):
            sock.sendall(view[start : start + step])
            time.sleep(pause)
        if close:
            sock.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_the_pending_bytes_then_exactly_the_rest_of_the_body_reach_the_file(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    client, server = connection
    pending = bytes(range(256)) * 100
    rest = os.urandom(5 * 1024 * 1024 + 17)
    after = b"GET /next HTTP/1.1\r\n\r\n"  # the next request: not part of this body
    sender = _send_in_background(client, rest + after, pause=0.01)
    target = tmp_path / "file"
    with target.open("wb") as file:
        taken = _Taken(server, pending, len(rest))
        written = splice_body(taken, file.fileno(), threading.Event())
    sender.join()
    assert written == len(pending) + len(rest)
    assert target.read_bytes() == pending + rest
    server.setblocking(True)
    assert server.recv(100) == after, "what follows the body stays in the socket"
    os.close(taken.fd)


def test_a_file_that_cannot_be_spliced_into_is_written_by_copying(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    # splice(2) refuses a file opened for appending (EINVAL), as it does on file systems without
    # splice support: the bytes go through memory instead, and all of them arrive.
    client, server = connection
    rest = os.urandom(3 * 1024 * 1024)
    sender = _send_in_background(client, rest)
    target = tmp_path / "file"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        taken = _Taken(server, b"head", len(rest))
        assert splice_body(taken, fd, threading.Event()) == 4 + len(rest)
    finally:
        os.close(fd)
        os.close(taken.fd)
    sender.join()
    assert target.read_bytes() == b"head" + rest


def test_a_client_that_closes_before_the_end_is_gone(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    client, server = connection
    sender = _send_in_background(client, b"x" * 100_000, close=True)
    with (tmp_path / "file").open("wb") as file:
        taken = _Taken(server, b"", 1_000_000)
        with pytest.raises(ClientGoneError, match="900000 bytes before the end"):
            splice_body(taken, file.fileno(), threading.Event())
    sender.join()
    os.close(taken.fd)


def test_a_client_that_stalls_is_dropped(connection: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    client, server = connection
    client.sendall(b"x" * 1000)
    with (tmp_path / "file").open("wb") as file:
        taken = _Taken(server, b"", 2000)
        started = time.monotonic()
        with pytest.raises(ClientGoneError, match=r"no part of the body went through for 0\.5 s"):
            splice_body(taken, file.fileno(), threading.Event(), stall_seconds=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    os.close(taken.fd)


def test_a_cancelled_splice_stops_its_thread_before_returning(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    _client, server = connection
    target = (tmp_path / "file").open("wb")
    taken = _Taken(server, b"", 10_000)

    async def cancel_midway() -> None:
        task = asyncio.create_task(splice_into(taken, target.fileno()))
        await asyncio.sleep(0.3)
        assert zerocopy._active == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    # The thread is done (no splice counted) and the body released as aborted, so the caller may
    # close the file at once.
    assert zerocopy._active == 0
    assert taken.released == [True]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("zerocopy") and _busy(thread)]
    target.close()


def _busy(thread: threading.Thread) -> bool:
    frames = __import__("sys")._current_frames()
    frame = frames.get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "splice_body":
            return True
        frame = frame.f_back
    return False


def test_a_spliced_body_is_released_as_complete(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    client, server = connection
    client.sendall(b"abc")
    with (tmp_path / "file").open("wb") as file:
        taken = _Taken(server, b"", 3)
        assert asyncio.run(splice_into(taken, file.fileno())) == 3
    assert taken.released == [False]
    assert (tmp_path / "file").read_bytes() == b"abc"


def test_a_file_is_sent_from_an_offset_and_a_shorter_one_ends_early(
    connection: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    client, server = connection  # here the server side sends
    data = os.urandom(6 * 1024 * 1024 + 3)
    source = tmp_path / "source"
    source.write_bytes(data)
    received = bytearray()

    def receive() -> None:
        while part := client.recv(1 << 20):
            received.extend(part)

    reader = threading.Thread(target=receive)
    reader.start()
    progress = [0]
    with source.open("rb") as file:
        sent = send_file(server.fileno(), file.fileno(), 5, len(data) - 5, threading.Event(), progress)
        # Asked for more than the file holds (it shrank since it was opened): what there is.
        assert send_file(server.fileno(), file.fileno(), len(data) - 10, 100, threading.Event(), progress) == 10
    server.shutdown(socket.SHUT_WR)
    reader.join()
    assert sent == len(data) - 5 and progress == [10]
    assert bytes(received) == data[5:] + data[-10:]


def test_a_reader_that_stalls_is_dropped(connection: tuple[socket.socket, socket.socket], tmp_path: Path) -> None:
    _client, server = connection  # the client reads nothing
    source = tmp_path / "source"
    source.write_bytes(bytes(64 * 1024 * 1024))
    progress = [0]
    with source.open("rb") as file, pytest.raises(ClientGoneError, match=r"went through for 0\.5 s"):
        send_file(server.fileno(), file.fileno(), 0, 64 * 1024 * 1024, threading.Event(), progress, stall_seconds=0.5)
    assert 0 < progress[0] < 64 * 1024 * 1024, "what the socket buffers took, and no more"
