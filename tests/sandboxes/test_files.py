"""read-file and write-file on real sandboxes."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from audit.models import AuditEvent, EventType
from common import zerocopy
from tests.live import LiveServer
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

OCTETS = {"Content-Type": "application/octet-stream"}


def _write(api: httpx.Client, sandbox_id: str, path: str, data: bytes) -> httpx.Response:
    return api.post(f"/api/v1/sandboxes/{sandbox_id}/write-file", params={"path": path}, content=data, headers=OCTETS)


def _read(api: httpx.Client, sandbox_id: str, path: str) -> httpx.Response:
    return api.post(f"/api/v1/sandboxes/{sandbox_id}/read-file", params={"path": path})


def test_binary_round_trip_with_nested_parents(api: httpx.Client, sandbox_id: str) -> None:
    data = bytes(range(256)) * 3
    written = _write(api, sandbox_id, "/home/ubuntu/a/b/c/all.bin", data)
    assert written.status_code == 200, written.text
    assert written.json() == {"path": "/home/ubuntu/a/b/c/all.bin", "size": len(data)}
    read = _read(api, sandbox_id, "/home/ubuntu/a/b/c/all.bin")
    assert read.status_code == 200
    assert read.headers["content-type"] == "application/octet-stream"
    assert read.headers["content-length"] == str(len(data)), "clients can show progress and check completeness"
    assert read.content == data
    # Written as the sandbox user, visible to commands.
    assert stdout_of(exec_lines(api, sandbox_id, "stat -c %u /home/ubuntu/a/b/c/all.bin")) == "1000\n"


def test_overwrite_is_atomic_and_complete(api: httpx.Client, sandbox_id: str) -> None:
    _write(api, sandbox_id, "/tmp/f", b"first version, longer")
    _write(api, sandbox_id, "/tmp/f", b"second")
    assert _read(api, sandbox_id, "/tmp/f").content == b"second"
    assert stdout_of(exec_lines(api, sandbox_id, "ls -A /tmp")).split() == ["f"], "no temporary files left"


def test_a_file_growing_while_read_is_read_as_it_was_opened(api: httpx.Client, sandbox_id: str) -> None:
    assert _write(api, sandbox_id, "/tmp/log", b"x" * (8 * 1024 * 1024)).status_code == 200
    # Something keeps appending while the file is read: the body is the size announced at open.
    exec_lines(api, sandbox_id, "nohup sh -c 'while :; do echo more >> /tmp/log; done' >/dev/null 2>&1 &")
    with api.stream("POST", f"/api/v1/sandboxes/{sandbox_id}/read-file", params={"path": "/tmp/log"}) as response:
        declared = int(response.headers["content-length"])
        body = b"".join(response.iter_bytes())
    exec_lines(api, sandbox_id, "pkill -f 'echo more' || true")
    assert declared >= 8 * 1024 * 1024 and len(body) == declared


def test_read_errors(api: httpx.Client, sandbox_id: str) -> None:
    missing = _read(api, sandbox_id, "/home/ubuntu/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"
    directory = _read(api, sandbox_id, "/home/ubuntu")
    assert directory.status_code == 400 and directory.json()["error"]["code"] == "is_a_directory"
    relative = _read(api, sandbox_id, "notes.txt")
    assert relative.status_code == 400 and "path" in relative.json()["error"]["details"]["fields"]
    no_path = api.post(f"/api/v1/sandboxes/{sandbox_id}/read-file")
    assert no_path.status_code == 400


def test_write_errors_leave_nothing_behind(api: httpx.Client, sandbox_id: str) -> None:
    wrong_type = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/write-file",
        params={"path": "/tmp/x"},
        content=b"x",
        headers={"Content-Type": "text/plain"},
    )
    assert wrong_type.status_code == 415 and wrong_type.json()["error"]["code"] == "unsupported_media_type"
    relative = _write(api, sandbox_id, "tmp/x", b"x")
    assert relative.status_code == 400
    onto_directory = _write(api, sandbox_id, "/home/ubuntu", b"x")
    assert onto_directory.status_code == 400
    assert stdout_of(exec_lines(api, sandbox_id, "ls -A /tmp")) == ""


def test_an_upload_cut_off_midway_leaves_nothing_behind(api: httpx.Client, sandbox_id: str) -> None:
    # The body is relayed to the sandbox as it arrives; a client that goes away mid-body must not
    # leave a partial file (nor a temporary one) behind, and the service goes on serving.
    target = urlsplit(str(api.base_url))
    with socket.create_connection((target.hostname, target.port)) as raw:
        raw.sendall(
            f"POST /api/v1/sandboxes/{sandbox_id}/write-file?path=/tmp/cut HTTP/1.1\r\n"
            f"Host: {target.hostname}\r\nAuthorization: {api.headers['Authorization']}\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\n".encode()
        )
        raw.sendall(b"x" * 1_000_000)
        time.sleep(0.3)
    wait_for(lambda: stdout_of(exec_lines(api, sandbox_id, "ls -A /tmp")) == "" or None)
    assert _write(api, sandbox_id, "/tmp/after", b"fine").status_code == 200
    assert stdout_of(exec_lines(api, sandbox_id, "ls -A /tmp")).split() == ["after"]


def _upload_head(api: httpx.Client, sandbox_id: str, path: str, length: int, extra: str = "") -> bytes:
    target = urlsplit(str(api.base_url))
    return (
        f"POST /api/v1/sandboxes/{sandbox_id}/write-file?path={path} HTTP/1.1\r\n"
        f"Host: {target.hostname}\r\nAuthorization: {api.headers['Authorization']}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _connect(api: httpx.Client) -> socket.socket:
    target = urlsplit(str(api.base_url))
    return socket.create_connection((target.hostname, target.port), timeout=60)


def _response(sock: socket.socket) -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response


def test_a_large_upload_goes_from_the_socket_into_the_file(api: httpx.Client, sandbox_id: str) -> None:
    # Past a megabyte still to come, the body is spliced from the client's socket into the file
    # (docs/sandboxes.md): the same bytes arrive, and the connection is closed after the answer
    # (the server's parser never saw the body, so it could not find a next request on it).
    data = os.urandom(8 * 1024 * 1024 + 5)
    written = _write(api, sandbox_id, "/home/ubuntu/spliced.bin", data)
    assert written.status_code == 200, written.text
    assert written.json() == {"path": "/home/ubuntu/spliced.bin", "size": len(data)}
    assert written.headers["connection"] == "close"
    assert _read(api, sandbox_id, "/home/ubuntu/spliced.bin").content == data
    # A small body is read as it arrives, and its connection is kept.
    small = _write(api, sandbox_id, "/home/ubuntu/small.bin", b"small")
    assert small.status_code == 200 and small.headers.get("connection") != "close"


def test_a_spliced_upload_answers_expect_100_continue(api: httpx.Client, sandbox_id: str) -> None:
    data = os.urandom(3 * 1024 * 1024)
    with _connect(api) as sock:
        sock.sendall(_upload_head(api, sandbox_id, "/tmp/continued", len(data), "Expect: 100-continue\r\n"))
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += sock.recv(1)
        assert interim.startswith(b"HTTP/1.1 100 ")
        sock.sendall(data)
        response = _response(sock)
        assert response.status == 200
        assert json.loads(response.read()) == {"path": "/tmp/continued", "size": len(data)}
    assert _read(api, sandbox_id, "/tmp/continued").content == data


def test_bytes_after_a_spliced_body_are_not_a_request(api: httpx.Client, sandbox_id: str) -> None:
    data = os.urandom(2 * 1024 * 1024)
    sneaky = _upload_head(api, sandbox_id, "/tmp/sneaky", 5) + b"hello"
    with _connect(api) as sock:
        sock.sendall(_upload_head(api, sandbox_id, "/tmp/body", len(data)) + data + sneaky)
        response = _response(sock)
        assert response.status == 200 and response.getheader("connection") == "close"
        assert json.loads(response.read())["size"] == len(data)
        assert sock.recv(100) == b"", "the connection ends after the answer"
    assert stdout_of(exec_lines(api, sandbox_id, "ls -A /tmp")).split() == ["body"]
    assert _read(api, sandbox_id, "/tmp/body").content == data


def test_slow_clients_cannot_take_every_upload(api: httpx.Client, sandbox_id: str) -> None:
    # Each spliced body holds a worker thread while its client sends. Clients that send half their
    # body and stop can hold at most common.zerocopy.MAX_TRANSFERS of them: the next upload is read
    # as it arrives (its connection kept) and succeeds meanwhile; the slow ones finish later.
    size = 4 * 1024 * 1024
    bodies = [os.urandom(size) for _ in range(zerocopy.MAX_TRANSFERS + 1)]
    slow = [_connect(api) for _ in bodies]
    try:
        for n, (sock, body) in enumerate(zip(slow, bodies, strict=True)):
            sock.sendall(_upload_head(api, sandbox_id, f"/tmp/slow{n}", size) + body[: size // 2])
        time.sleep(2)  # every slow upload reaches its view and waits for the rest of its body
        meanwhile = os.urandom(size)
        written = _write(api, sandbox_id, "/tmp/meanwhile", meanwhile)
        assert written.status_code == 200, written.text
        assert written.headers.get("connection") != "close", "read as it arrived, not spliced"
        for sock, body in zip(slow, bodies, strict=True):
            sock.sendall(body[size // 2 :])
        for sock in slow:
            response = _response(sock)
            assert response.status == 200
            assert json.loads(response.read())["size"] == size
    finally:
        for sock in slow:
            sock.close()
    assert _read(api, sandbox_id, "/tmp/meanwhile").content == meanwhile
    for n, body in enumerate(bodies):
        assert _read(api, sandbox_id, f"/tmp/slow{n}").content == body


def test_files_are_audited(api: httpx.Client, sandbox_id: str) -> None:
    _write(api, sandbox_id, "/tmp/audited", b"12345")
    _read(api, sandbox_id, "/tmp/audited")
    write = wait_for(lambda: AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.WRITE_FILE).first())
    assert write.data == {"path": "/tmp/audited", "bytes": 5}
    read = wait_for(lambda: AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.READ_FILE).first())
    assert read.data["path"] == "/tmp/audited" and read.data["bytes"] == 5


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_200_mb_file_with_bounded_server_memory(api: httpx.Client, sandbox_id: str, live: LiveServer) -> None:
    size = 200 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)
    before = _rss_kib(live.process.pid)

    def body() -> Iterator[bytes]:
        for _ in range(size // len(chunk)):
            yield chunk

    written = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/write-file",
        params={"path": "/home/ubuntu/big"},
        content=body(),
        headers=OCTETS,
    )
    assert written.status_code == 200, written.text
    assert written.json()["size"] == size
    received = 0
    first = b""
    with api.stream(
        "POST", f"/api/v1/sandboxes/{sandbox_id}/read-file", params={"path": "/home/ubuntu/big"}
    ) as response:
        for part in response.iter_bytes():
            if not first:
                first = part[: len(chunk)]
            received += len(part)
    assert received == size
    assert first == chunk[: len(first)]
    growth_mib = (_rss_kib(live.process.pid) - before) / 1024
    assert growth_mib < 64, f"server memory grew by {growth_mib:.0f} MiB moving a 200 MiB file"


def _read_request(api: httpx.Client, sandbox_id: str, path: str) -> bytes:
    target = urlsplit(str(api.base_url))
    return (
        f"POST /api/v1/sandboxes/{sandbox_id}/read-file?path={path} HTTP/1.1\r\n"
        f"Host: {target.hostname}\r\nAuthorization: {api.headers['Authorization']}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def _read_event(sandbox_id: str, path: str) -> AuditEvent | None:
    return AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.READ_FILE, data__path=path).first()


def test_a_download_cut_off_midway_is_audited_as_incomplete(api: httpx.Client, sandbox_id: str) -> None:
    # The file is sent from the page cache by the kernel (docs/sandboxes.md); a client that leaves
    # midway ends it, the log says how much went out, and the service goes on serving.
    size = 64 * 1024 * 1024
    assert exec_lines(api, sandbox_id, f"head -c {size} /dev/zero > ~/zeros")[-1]["exitCode"] == 0
    with _connect(api) as sock:
        sock.sendall(_read_request(api, sandbox_id, "/home/ubuntu/zeros"))
        received = 0
        while received < 1024 * 1024:
            received += len(sock.recv(65536))
    event = wait_for(lambda: _read_event(sandbox_id, "/home/ubuntu/zeros"))
    assert event.data["complete"] is False
    assert 1024 * 1024 <= event.data["bytes"] < size
    read = _read(api, sandbox_id, "/home/ubuntu/zeros")
    assert read.status_code == 200 and len(read.content) == size and read.content.count(0) == size


def test_stalled_transfers_are_dropped(tmp_path: object, enabled: object, transactional_db: None) -> None:
    from tests.live import start_live_server, stop_live_server

    server = start_live_server({"FILE_TRANSFER_STALL_SECONDS": "1"})
    try:
        with httpx.Client(base_url=server.url, headers=enabled.auth, timeout=60) as client:  # type: ignore[attr-defined]
            sandbox_id = client.post("/api/v1/sandboxes").json()["id"]
            size = 4 * 1024 * 1024
            with _connect(client) as sock:
                sock.sendall(_upload_head(client, sandbox_id, "/tmp/stalled", size) + b"x" * (size // 2))
                started = time.monotonic()
                try:
                    closed = sock.recv(100) == b""
                except ConnectionResetError:
                    closed = True
                assert closed, "the server drops the connection"
                assert 1 <= time.monotonic() - started < 10
            wait_for(lambda: stdout_of(exec_lines(client, sandbox_id, "ls -A /tmp")) == "" or None)
            assert _write(client, sandbox_id, "/tmp/after", b"fine").status_code == 200
            # A client that stops reading a download: far more than the socket buffers hold.
            size = 128 * 1024 * 1024
            assert exec_lines(client, sandbox_id, f"head -c {size} /dev/zero > ~/zeros")[-1]["exitCode"] == 0
            with _connect(client) as sock:
                sock.sendall(_read_request(client, sandbox_id, "/home/ubuntu/zeros"))
                time.sleep(4)  # the socket buffers fill, then nothing moves for over a second
                received = 0
                while part := sock.recv(1024 * 1024):
                    received += len(part)
                assert received < size, "the server dropped the connection before the end"
            event = wait_for(lambda: _read_event(sandbox_id, "/home/ubuntu/zeros"))
            assert event.data["complete"] is False and event.data["bytes"] < size
            assert _read(client, sandbox_id, "/tmp/after").content == b"fine"
            client.delete(f"/api/v1/sandboxes/{sandbox_id}")
    finally:
        stop_live_server(server)


def test_size_limit_is_413(tmp_path: object, enabled: object, transactional_db: None) -> None:
    from tests.live import start_live_server, stop_live_server

    server = start_live_server({"SANDBOX_WRITE_MAX_BYTES": "1000"})
    try:
        headers = {**enabled.auth}  # type: ignore[attr-defined]
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            sandbox_id = client.post("/api/v1/sandboxes").json()["id"]
            too_big = _write(client, sandbox_id, "/tmp/big", b"x" * 1001)
            assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "payload_too_large"
            # Without a Content-Length (chunked), the body is counted as it arrives and refused there.
            chunked = client.post(
                f"/api/v1/sandboxes/{sandbox_id}/write-file",
                params={"path": "/tmp/chunked"},
                content=iter([b"x" * 600, b"x" * 600]),
                headers=OCTETS,
            )
            assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "payload_too_large"
            assert _write(client, sandbox_id, "/tmp/ok", b"x" * 1000).status_code == 200
            assert stdout_of(exec_lines(client, sandbox_id, "ls /tmp")).split() == ["ok"]
            client.delete(f"/api/v1/sandboxes/{sandbox_id}")
    finally:
        stop_live_server(server)
