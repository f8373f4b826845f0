"""A real ASGI server process (the one `make run` uses) serving the app against the test database, for streaming and WebSocket tests.

Tests that use it must commit their data (``@pytest.mark.django_db(transaction=True)``), since the
server is another process with its own connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection

from common import http_server

ROOT = Path(__file__).resolve().parent.parent
# As `make run` serves the app (common/management/commands/runall.py).
SERVER_ARGS = ["--host", "127.0.0.1", "--lifespan", "off", "--no-access-log", "--log-level", "warning"]
SERVER_ARGS += ["--http", http_server.PROTOCOL]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_live_server(extra_env: dict[str, str] | None = None) -> LiveServer:
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "SVC_VAR_DIR": str(settings.VAR_DIR),
        "SVC_TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PORT": str(port),
        "BASE_URL": f"http://127.0.0.1:{port}",
        **(extra_env or {}),
    }
    log_path = Path(settings.VAR_DIR) / f"live-{port}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", *SERVER_ARGS, "--port", str(port), "config.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = LiveServer(url=f"http://127.0.0.1:{port}", port=port, process=process, log_path=log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"live server exited:\n{server.log()}")
        try:
            httpx.get(f"{server.url}/healthz", timeout=1)
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"live server did not start:\n{server.log()}")


def stop_live_server(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def live_server_fixture() -> Iterator[LiveServer]:
    server = start_live_server()
    try:
        yield server
    finally:
        stop_live_server(server)


@dataclass
class CeleryProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_celery(kind: str, extra_env: dict[str, str] | None = None) -> CeleryProcess:
    """Start a real Celery ``worker`` or ``beat`` against the test database and the configured broker."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "SVC_VAR_DIR": str(settings.VAR_DIR),
        "SVC_TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        **(extra_env or {}),
    }
    log_path = Path(settings.VAR_DIR) / f"celery-{kind}-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "celery", "-A", "config", kind, "--loglevel=INFO"]
    if kind == "worker":
        args += ["--concurrency=2", "--pool=prefork", f"--hostname=test-{os.getpid()}-{time.monotonic_ns()}@%h"]
    else:
        args += ["--schedule", str(Path(settings.VAR_DIR) / f"beat-{time.monotonic_ns()}")]
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    started = CeleryProcess(process=process, log_path=log_path)
    marker = "ready." if kind == "worker" else "beat: Starting"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"celery {kind} exited:\n{started.log()}")
        if marker in started.log():
            return started
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"celery {kind} did not start:\n{started.log()}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
