"""A connection to a local daemon carries the next command once the previous one was answered to its
end (sandboxd's REUSABLE_OPS, the client's kept connections); anything else ends it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from sandboxd.protocol import HEADER, PROTOCOL_VERSION, Kind, decode_json, encode_json, parse_header
from sandboxes import daemon_client
from sandboxes.daemon_client import DaemonClient, ExecStarted
from sandboxes.runtimes.base import SandboxHandle


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    daemon_client.forget_kept()
    yield
    daemon_client.forget_kept()


def _key(sandbox: SandboxHandle) -> tuple[str, str]:
    assert sandbox.address.unix_path is not None
    return sandbox.address.unix_path, sandbox.secret


def _kept_sockets(sandbox: SandboxHandle) -> list[socket.socket]:
    return [sock for sock, _since in daemon_client._kept.get(_key(sandbox), [])]


async def test_consecutive_commands_share_one_connection(client: DaemonClient, sandbox: SandboxHandle) -> None:
    assert (await client.run("echo one")).text == "one\n"
    [kept] = _kept_sockets(sandbox)
    assert (await client.run("echo two; exit 3")).exit_code == 3
    assert _kept_sockets(sandbox) == [kept]  # the same connection carried the second command


async def test_a_connection_the_daemon_closed_is_not_used(client: DaemonClient, sandbox: SandboxHandle) -> None:
    stale, peer = socket.socketpair()
    peer.close()
    daemon_client._kept[_key(sandbox)] = [(stale, time.monotonic())]
    assert (await client.run("echo fresh")).text == "fresh\n"
    assert stale.fileno() == -1  # closed, not used
    assert len(_kept_sockets(sandbox)) == 1


async def test_a_destroyed_sandboxs_connections_are_closed(client: DaemonClient, sandbox: SandboxHandle) -> None:
    await client.run("true")
    [kept] = _kept_sockets(sandbox)
    daemon_client.forget_kept(sandbox.address.unix_path)
    assert kept.fileno() == -1
    assert _kept_sockets(sandbox) == []


async def test_a_kept_connection_expires(
    client: DaemonClient, sandbox: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.run("true")
    [first] = _kept_sockets(sandbox)
    monkeypatch.setattr(daemon_client, "KEPT_SECONDS", 0.0)
    await client.run("true")
    assert first.fileno() == -1
    assert _kept_sockets(sandbox) != [first]


async def test_a_command_stopped_early_leaves_nothing_kept(client: DaemonClient, sandbox: SandboxHandle) -> None:
    stream = await client.start_exec("sleep 30")
    async for event in stream:
        if isinstance(event, ExecStarted):
            break
    await stream.aclose()
    assert _kept_sockets(sandbox) == []
    # The daemon saw the connection end and killed the command.
    for _ in range(100):
        check = await client.run("pgrep -x sleep || echo none")
        if check.text == "none\n":
            break
        await asyncio.sleep(0.05)
    assert check.text == "none\n"


def _request(sock: socket.socket, secret: str, **fields: object) -> None:
    sock.sendall(encode_json({"v": PROTOCOL_VERSION, "secret": secret, **fields}))


def _answers_until(sock: socket.socket, last: str) -> list[dict[str, object]]:
    """The daemon's JSON messages up to and including the one of type ``last`` (output skipped)."""
    messages: list[dict[str, object]] = []
    while True:
        kind, length = parse_header(_exactly(sock, HEADER.size))
        payload = _exactly(sock, length)
        if kind == Kind.JSON:
            message = decode_json(payload)
            messages.append(message)
            if message.get("type") in (last, "error"):
                return messages


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def test_the_daemon_serves_requests_one_after_another_until_one_fails(sandbox: SandboxHandle) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(sandbox.address.unix_path))
        _request(sock, sandbox.secret, op="exec", command="echo hi")
        assert _answers_until(sock, "exit")[-1]["exitCode"] == 0
        _request(sock, sandbox.secret, op="ping")
        assert _answers_until(sock, "pong")[-1]["type"] == "pong"
        # Every request is checked, not only a connection's first.
        _request(sock, "not-the-secret", op="ping")
        assert _answers_until(sock, "pong")[-1]["code"] == "unauthorized"
        with pytest.raises(EOFError):
            _exactly(sock, 1)  # a refused request ends the connection


def test_an_error_ends_the_connection(sandbox: SandboxHandle) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(sandbox.address.unix_path))
        _request(sock, sandbox.secret, op="exec", command="true", workdir="/no/such/dir")
        assert _answers_until(sock, "exit")[-1]["code"] == "workdir_missing"
        with pytest.raises(EOFError):
            _exactly(sock, 1)
