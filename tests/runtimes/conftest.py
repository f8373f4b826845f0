"""Real bubblewrap sandboxes for the runtime and daemon tests (no mocks: they need bwrap on the host).

One runtime per test session under a private root in /tmp (the sandbox's host uid must be able to
traverse it, which pytest's 0700 tmp_path does not allow), one sandbox per test module, and a small
HTTP server standing in for the service so the forwarded service port can be checked.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socketserver
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxes.daemon_client import DaemonClient
from sandboxes.runtimes.base import SandboxHandle
from sandboxes.runtimes.local import LocalRuntime, LocalRuntimeConfig


@dataclass
class ServiceStub:
    port: int
    body: bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b"service-stub-ok"
    # A token exchange that answers after EXCHANGE_DELAY seconds (POST /slow-exchange), and one that
    # refuses (POST /failing-exchange), for the daemon's background exchange.
    exchanged_token = "stub-exchanged-token"
    exchange_delay = 0.5

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/slow-exchange":
            time.sleep(self.exchange_delay)
            status, answer = 200, {"access_token": self.exchanged_token, "expires_in": 600}
        else:
            status, answer = 500, {"error": "server_error"}
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def service_stub() -> Iterator[ServiceStub]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ServiceStub(port=server.server_address[1], body=_Handler.body)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def runtime_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="svc-sbx-", dir="/tmp"))
    os.chmod(root, 0o711)  # noqa: S103 - sandbox host uids must traverse it
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def local_runtime(runtime_root: Path, service_stub: ServiceStub) -> Iterator[LocalRuntime]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    runtime = LocalRuntime(LocalRuntimeConfig(root=runtime_root, service_port=service_stub.port))
    caps = runtime.capabilities()
    if not caps.available:
        pytest.fail("local runtime unavailable: " + "; ".join(caps.problems))
    yield runtime
    for info in runtime.list():
        runtime.destroy(info.sandbox_id)


def new_sandbox_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def sandbox(local_runtime: LocalRuntime) -> Iterator[SandboxHandle]:
    handle = local_runtime.create(new_sandbox_id())
    yield handle
    local_runtime.destroy(handle.sandbox_id)


@pytest.fixture
def client(sandbox: SandboxHandle) -> DaemonClient:
    return DaemonClient(sandbox.address, sandbox.secret)
