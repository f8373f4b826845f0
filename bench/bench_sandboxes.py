"""Sandboxes over HTTP against the bare limit of the same work on this machine, in one run.

Sets up its own world: a temporary state directory (SQLite database migrated there, its own
sandbox root), an organization with sandboxes enabled and an owner token, and this service served as
`make run` serves it (uvicorn, `--lifespan off`, production settings) in a separate process: once with
the warm pool off (cold creates), once with it on (everything else).

Figures (median over repeats; the spread, min..max, is printed with each, since the machine may be
shared):
  (a) POST /sandboxes -> first exec `true` done, warm pool and cold, / a bare `bwrap ... sh -c true`
      with the runtime's namespaces (target <= 3 and < 100 ms)
  (b) exec `true` round trip over HTTP / `bash -c true` spawned inside the sandbox, which is what
      the daemon runs for every exec (target <= 2), the two measured in alternating rounds; plain
      `true` is printed too.
  (a) and (b) use the standard library's keep-alive HTTP client: httpx spends most of a millisecond
      of its own per request, which is the client's cost, not the service's (its figures are printed
      too)
  (c) exec stdout MB/s over HTTP / the same producer read from a raw pipe in this process (target >= 0.3)
  (d) write-file and read-file MB/s with curl as the client / a local `cp` of the same size
      (target >= 0.5), and the server's RSS growth while a 1 GiB file goes each way (target < 50 MB);
      the same transfers with httpx are printed too (a Python client is slower than the service)
  (c) and (d) take a sample of the bare limit and of the service in turn, ROUNDS times: the pipe's
      and cp's own rates move by half within minutes on a shared machine.
  (e) 100 concurrent execs across 10 sandboxes: how many complete, and the server's peak RSS

Standalone: .venv/bin/python -m bench.bench_sandboxes
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import signing_key_file
from common import http_server

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
CREATE_REPEATS = 21
EXEC_REPEATS = 200
# (b) alternates this many rounds of spawns inside and round trips (EXEC_REPEATS in all).
EXEC_ROUNDS = 10
# (c) and (d) take this many samples of the service and of the bare limit, in turn.
ROUNDS = 5
STREAM_BYTES = 256 * MB
FILE_BYTES = 256 * MB
BIG_FILE_BYTES = 1024 * MB
POOL_SIZE = 2
PRODUCER = "yes " + "x" * 1023  # 1 KiB lines: printable, so JSON carries them unescaped

Figure = tuple[float, float, float]  # median, min, max


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stats(values: list[float]) -> Figure:
    return statistics.median(values), min(values), max(values)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class _PeakRss:
    """Samples a process's RSS every few milliseconds while a block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = _rss_bytes(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes(self.pid))

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes(self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.before


class Service:
    def __init__(self, workdir: Path, env: dict[str, str], pool_size: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"server-{self.port}.log"
        server_env = {
            **env,
            "PORT": str(self.port),
            "BASE_URL": self.url,
            "SANDBOX_WARM_POOL_SIZE": str(pool_size),
        }
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--lifespan", "off", "--no-access-log"]
        args += ["--http", http_server.PROTOCOL]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", *args, "config.asgi:application"],
            cwd=ROOT,
            env=server_env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)

    def pool_ready(self) -> int:
        checks = httpx.get(f"{self.url}/healthz", timeout=10).json()["checks"]
        return int(checks["sandbox_runtime"]["warmPool"]["ready"])

    def wait_for_pool(self, size: int) -> None:
        deadline = time.monotonic() + 60
        while self.pool_ready() < size:
            if time.monotonic() > deadline:
                raise RuntimeError("the warm pool did not fill")
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _exec(client: httpx.Client, sandbox_id: str, command: str) -> tuple[int, str]:
    """Run a command; its exit code and stdout."""
    out: list[str] = []
    exit_code = -1
    with client.stream("POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": command}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            event = json.loads(line)
            if event["type"] == "stdout":
                out.append(event["data"])
            elif event["type"] == "done":
                exit_code = event["exitCode"]
    return exit_code, "".join(out)


class LeanClient:
    """The API over one keep-alive http.client connection: httpx spends most of a millisecond of
    its own per request, which the round-trip figures would otherwise count as the service's."""

    def __init__(self, url: str, auth: dict[str, str]) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=60)
        self.headers = {**auth, "Content-Type": "application/json"}

    def request(self, method: str, path: str, body: str = "") -> tuple[int, bytes]:
        self.connection.request(method, path, body, self.headers)
        response = self.connection.getresponse()
        return response.status, response.read()

    def create(self) -> str:
        status, body = self.request("POST", "/api/v1/sandboxes")
        assert status == 201, body
        return str(json.loads(body)["id"])

    def exec_true(self, sandbox_id: str) -> None:
        """exec `true`, the whole NDJSON stream read."""
        status, body = self.request("POST", f"/api/v1/sandboxes/{sandbox_id}/exec", '{"command": "true"}')
        lines = body.splitlines()
        assert status == 200 and json.loads(lines[-1]) == {"type": "done", "exitCode": 0}, lines

    def exec_stdout_bytes(self, sandbox_id: str, command: str) -> int:
        """Run ``command``, decoding the NDJSON stream as it arrives; the characters of stdout.

        Lines are decoded with orjson, as the service encodes them: the standard library's decoder
        takes about 1.2 ms per MB on this machine, more CPU than the whole relay in the service,
        and on two CPUs the client's time is taken from the service's."""
        body = json.dumps({"command": command})
        self.connection.request("POST", f"/api/v1/sandboxes/{sandbox_id}/exec", body, self.headers)
        response = self.connection.getresponse()
        assert response.status == 200, response.read()
        received = 0
        last: dict[str, Any] = {}
        partial: list[bytes] = []
        # Whatever the connection holds, split at newlines found in the new bytes only: a line of
        # a megabyte arrives in many reads, and rescanning it on each would cost the client more
        # than the service spends on it.
        while block := response.read1(MB):
            start = 0
            while (end := block.find(b"\n", start)) >= 0:
                partial.append(block[start:end])
                last = orjson.loads(b"".join(partial))
                partial.clear()
                if last["type"] == "stdout":
                    received += len(last["data"])
                start = end + 1
            partial.append(block[start:])
        assert last == {"type": "done", "exitCode": 0}, last
        return received

    def delete(self, sandbox_id: str) -> None:
        status, body = self.request("DELETE", f"/api/v1/sandboxes/{sandbox_id}")
        assert status == 204, body

    def close(self) -> None:
        self.connection.close()


def exec_round_trips_alongside_spawns(
    url: str, auth: dict[str, str], client: httpx.Client, sandbox_id: str, rounds: int
) -> tuple[Figure, float]:
    """exec `true` round trips (keep-alive client, whole NDJSON read) and `bash -c true` spawned
    inside, in alternating rounds: the ratio compares the two under the same machine conditions."""
    lean = LeanClient(url, auth)
    try:
        for _ in range(5):
            lean.exec_true(sandbox_id)
        trips: list[float] = []
        spawns: list[float] = []
        per_round = EXEC_REPEATS // rounds
        for _ in range(rounds):
            spawns.append(spawn_inside_seconds(client, sandbox_id, ["/bin/bash", "-c", "true"], repeats=40))
            # As for the spawns inside (spawn_inside_seconds), each round's first tenth is not
            # counted: the first requests after a pause find the processes idle and their caches
            # cold, and the spawns' script discards its own first tenth for the same reason.
            round_trips = [_timed(lambda: lean.exec_true(sandbox_id)) for _ in range(per_round + per_round // 10)]
            trips.extend(round_trips[per_round // 10 :])
        return _stats(trips), statistics.median(spawns)
    finally:
        lean.close()


def _create(client: httpx.Client) -> str:
    response = client.post("/api/v1/sandboxes")
    response.raise_for_status()
    return str(response.json()["id"])


def _timed(function: Callable[[], Any]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


# --- bare limits --------------------------------------------------------------------------------


def bare_bwrap_argv() -> list[str]:
    from sandboxes.runtimes.local import LocalRuntime

    return [
        shutil.which("bwrap") or "bwrap",
        *LocalRuntime._base_namespace_args(True),
        "--ro-bind", "/usr", "/usr",
        *LocalRuntime._merged_usr_args(),
        "--proc", "/proc",
        "--dev", "/dev",
        "--", "sh", "-c", "true",
    ]  # fmt: skip


def bare_bwrap_once() -> float:
    argv = bare_bwrap_argv()
    return _timed(lambda: subprocess.run(argv, check=True))


def bare_bwrap_seconds(repeats: int) -> Figure:
    bare_bwrap_once()
    return _stats([bare_bwrap_once() for _ in range(repeats)])


def bare_pipe_mb_s(size: int) -> float:
    """The producer of (c) read from a raw pipe in this process, once."""
    started = time.perf_counter()
    producer = subprocess.Popen(f"{PRODUCER} | head -c {size}", shell=True, stdout=subprocess.PIPE, bufsize=0)
    assert producer.stdout is not None
    received = 0
    while chunk := producer.stdout.read(MB):  # unbuffered: whatever the pipe holds
        received += len(chunk)
    producer.wait()
    return received / MB / (time.perf_counter() - started)


def bare_cp_mb_s(source: Path, target: Path, size: int) -> float:
    """A local `cp` of ``source``, once; the target absent when the clock starts."""
    target.unlink(missing_ok=True)
    elapsed = _timed(lambda: subprocess.run(["cp", str(source), str(target)], check=True))
    target.unlink()
    return size / MB / elapsed


# --- through the service --------------------------------------------------------------------------


def create_to_first_exec(service: Service, auth: dict[str, str], repeats: int, pool_size: int) -> tuple[Figure, Figure]:
    client = LeanClient(service.url, auth)
    try:
        return _create_to_first_exec(service, client.create, client.exec_true, client.delete, repeats, pool_size)
    finally:
        client.close()


def create_to_first_exec_httpx(
    service: Service, client: httpx.Client, repeats: int, pool_size: int
) -> tuple[Figure, Figure]:
    def exec_true(sandbox_id: str) -> None:
        assert _exec(client, sandbox_id, "true")[0] == 0

    def delete(sandbox_id: str) -> None:
        client.delete(f"/api/v1/sandboxes/{sandbox_id}").raise_for_status()

    return _create_to_first_exec(service, lambda: _create(client), exec_true, delete, repeats, pool_size)


def _create_to_first_exec(
    service: Service,
    create: Callable[[], str],
    exec_true: Callable[[str], None],
    delete: Callable[[str], None],
    repeats: int,
    pool_size: int,
) -> tuple[Figure, Figure]:
    """The service's figure and the bare bwrap's, measured alternately: this machine's speed drifts
    by a third within minutes, and the ratio must compare the two under the same conditions."""
    samples, bare = [], []
    for _ in range(repeats + 1):
        if pool_size:
            service.wait_for_pool(pool_size)
        bare.append(bare_bwrap_once())
        started = time.perf_counter()
        sandbox_id = create()
        exec_true(sandbox_id)
        samples.append(time.perf_counter() - started)
        delete(sandbox_id)
    # The first ones warm the server's code paths and the page cache.
    return _stats(samples[1:]), _stats(bare[1:])


def spawn_inside_seconds(client: httpx.Client, sandbox_id: str, argv: list[str], repeats: int = 200) -> float:
    script = (
        "import subprocess, time, statistics\n"
        f"argv = {argv!r}\n"
        "samples = []\n"
        f"for _ in range({repeats}):\n"
        "    t = time.perf_counter(); subprocess.run(argv); samples.append(time.perf_counter() - t)\n"
        f"print(statistics.median(samples[{repeats // 10}:]))\n"
    )
    exit_code, out = _exec(client, sandbox_id, f"python3 - <<'PY'\n{script}PY")
    assert exit_code == 0, out
    return float(out.strip())


def exec_stream_mb_s(client: httpx.Client, sandbox_id: str, size: int) -> float:
    """(c) with httpx as the client: its line splitting costs more than the service's whole relay."""
    started = time.perf_counter()
    received = 0
    with client.stream(
        "POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": f"{PRODUCER} | head -c {size}"}
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            event = json.loads(line)
            if event["type"] == "stdout":
                received += len(event["data"])
    elapsed = time.perf_counter() - started
    assert received == size, (received, size)
    return size / MB / elapsed


def lean_exec_stream_mb_s(lean: LeanClient, sandbox_id: str, size: int) -> float:
    started = time.perf_counter()
    received = lean.exec_stdout_bytes(sandbox_id, f"{PRODUCER} | head -c {size}")
    elapsed = time.perf_counter() - started
    assert received == size, (received, size)
    return size / MB / elapsed


def exec_stream_alongside_pipe(url: str, auth: dict[str, str], sandbox_id: str, size: int) -> tuple[Figure, Figure]:
    """(c): the exec stream (standard-library client, every line decoded) and the raw pipe, one
    sample of each in turn (ROUNDS), so the ratio compares the two under the same machine
    conditions; (stream, pipe)."""
    lean = LeanClient(url, auth)
    try:
        stream, pipe = [], []
        for _ in range(ROUNDS):
            pipe.append(bare_pipe_mb_s(size))
            stream.append(lean_exec_stream_mb_s(lean, sandbox_id, size))
        return _stats(stream), _stats(pipe)
    finally:
        lean.close()


def _body(size: int) -> Iterator[bytes]:
    chunk = os.urandom(MB)
    for _ in range(size // MB):
        yield chunk


def write_file_mb_s(client: httpx.Client, sandbox_id: str, size: int, repeats: int = 3) -> Figure:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.post(
            f"/api/v1/sandboxes/{sandbox_id}/write-file?path=/home/ubuntu/big",
            content=_body(size),
            headers={"Content-Type": "application/octet-stream"},
        )
        response.raise_for_status()
        assert response.json()["size"] == size
        samples.append(size / MB / (time.perf_counter() - started))
    return _stats(samples)


def read_file_mb_s(client: httpx.Client, sandbox_id: str, size: int, repeats: int = 3) -> Figure:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        received = 0
        with client.stream("POST", f"/api/v1/sandboxes/{sandbox_id}/read-file?path=/home/ubuntu/big") as response:
            response.raise_for_status()
            for chunk in response.iter_bytes(MB):
                received += len(chunk)
        assert received == size
        samples.append(size / MB / (time.perf_counter() - started))
    return _stats(samples)


class Curl:
    """Transfers with curl, a client that is not itself the bottleneck (httpx tops out near the
    service's own rate, so it would measure itself)."""

    def __init__(self, url: str, token: str, workdir: Path) -> None:
        self.url = url
        self.base = [shutil.which("curl") or "curl", "-sS", "-f", "-X", "POST", "-H", f"Authorization: Bearer {token}"]
        self.source = workdir / "curl-source"

    def prepare(self, size: int) -> None:
        with self.source.open("wb") as f:
            chunk = os.urandom(MB)
            for _ in range(size // MB):
                f.write(chunk)

    def write_mb_s(self, sandbox_id: str, size: int) -> float:
        url = f"{self.url}/api/v1/sandboxes/{sandbox_id}/write-file?path=/home/ubuntu/big"
        # -T streams the file (with its Content-Length); no Expect: 100-continue round trip.
        argv = [*self.base, "-T", str(self.source), "-H", "Content-Type: application/octet-stream", "-H", "Expect:"]
        started = time.perf_counter()
        out = subprocess.run([*argv, url], check=True, capture_output=True).stdout
        elapsed = time.perf_counter() - started
        assert json.loads(out)["size"] == size
        return size / MB / elapsed

    def read_mb_s(self, sandbox_id: str, size: int) -> float:
        url = f"{self.url}/api/v1/sandboxes/{sandbox_id}/read-file?path=/home/ubuntu/big"
        argv = [*self.base, "-o", "/dev/null", "-w", "%{size_download}", url]
        started = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        elapsed = time.perf_counter() - started
        assert int(out) == size
        return size / MB / elapsed

    def alongside_cp(
        self, client: httpx.Client, sandbox_id: str, size: int, workdir: Path
    ) -> tuple[Figure, Figure, Figure]:
        """(d): write-file, read-file and a local `cp` of the same file, one sample of each in turn
        (ROUNDS), so the ratios compare them under the same machine conditions; (write, read, cp).
        As for cp, the target does not exist when a write's clock starts (freeing a replaced file
        is the kernel's work, not the transfer's)."""
        write, read, cp = [], [], []
        for _ in range(ROUNDS):
            cp.append(bare_cp_mb_s(self.source, workdir / "cp-target", size))
            _exec(client, sandbox_id, "rm -f ~/big")
            write.append(self.write_mb_s(sandbox_id, size))
            read.append(self.read_mb_s(sandbox_id, size))
        return _stats(write), _stats(read), _stats(cp)


async def _concurrent_execs(url: str, auth: dict[str, str], sandbox_ids: list[str], per_sandbox: int) -> int:
    limits = httpx.Limits(max_connections=len(sandbox_ids) * per_sandbox)
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=300, limits=limits) as client:

        async def one(sandbox_id: str, n: int) -> bool:
            command = f"echo start {n}; sleep 0.5; head -c 100000 /dev/urandom | base64; echo end {n}"
            async with client.stream(
                "POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": command}
            ) as response:
                done = None
                text = []
                async for line in response.aiter_lines():
                    event = json.loads(line)
                    if event["type"] == "stdout":
                        text.append(event["data"])
                    elif event["type"] == "done":
                        done = event["exitCode"]
                return done == 0 and "".join(text).rstrip().endswith(f"end {n}")

        results = await asyncio.gather(*(one(s, n) for s in sandbox_ids for n in range(per_sandbox)))
    return sum(results)


# --- the run ------------------------------------------------------------------------------------


def _environment(workdir: Path) -> dict[str, str]:
    var = workdir / "var"
    var.mkdir()
    # Sandboxes run as unprivileged host users and live below this directory: it must be traversable.
    os.chmod(workdir, 0o755)
    os.chmod(var, 0o755)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SVC_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "ALLOWED_HOSTS": "127.0.0.1",
        "SVC_VAR_DIR": str(var),
        "DEBUG": "false",
        "LOG_LEVEL": "WARNING",
    }
    env["OIDC_SIGNING_KEY_FILES"] = signing_key_file(workdir)
    env.pop("DATABASE_URL", None)  # fresh SQLite state: the bench never touches a real database
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    return env


def _token(env: dict[str, str]) -> str:
    return subprocess.run(
        [
            sys.executable,
            "manage.py",
            "createtoken",
            "--org",
            "bench",
            "--email",
            "bench@bench.test",
            "--role",
            "owner",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _ms(value: Figure) -> Figure:
    return (1000 * value[0], 1000 * value[1], 1000 * value[2])


def _row(name: str, value: Figure, unit: str, limit: Figure | None, ratio: float | None, target: str) -> None:
    median, low, high = value
    spread = f"{low:.4g}..{high:.4g}"
    limit_text = f"{limit[0]:.4g} {unit}" if limit else "-"
    ratio_text = f"{ratio:.3g}" if ratio is not None else "-"
    print(f"{name:<38} {median:>10.4g} {unit:<5} ({spread:>17})  {limit_text:>14}  {ratio_text:>7}  {target}")


def run() -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-sandboxes-", dir="/tmp"))
    env = _environment(workdir)
    auth = {"Authorization": f"Bearer {_token(env)}"}
    results: dict[str, float] = {}
    services: list[Service] = []
    try:
        bwrap = bare_bwrap_seconds(30)

        cold_service = Service(workdir, env, pool_size=0)
        services.append(cold_service)
        with httpx.Client(base_url=cold_service.url, headers=auth, timeout=300) as client:
            client.patch("/api/v1/organization", json={"sandboxesEnabled": True}).raise_for_status()
            cold, cold_bwrap = create_to_first_exec(cold_service, auth, CREATE_REPEATS, 0)
        cold_service.stop()
        services.remove(cold_service)

        service = Service(workdir, env, pool_size=POOL_SIZE)
        services.append(service)
        with httpx.Client(base_url=service.url, headers=auth, timeout=300) as client:
            warm, warm_bwrap = create_to_first_exec(service, auth, CREATE_REPEATS, POOL_SIZE)
            warm_httpx, warm_httpx_bwrap = create_to_first_exec_httpx(service, client, CREATE_REPEATS, POOL_SIZE)

            sandbox_id = _create(client)
            # The claim above refills the pool in the background (shortly after it), and that is
            # not part of what the following figures measure.
            service.wait_for_pool(POOL_SIZE)
            round_trip, spawn_bash = exec_round_trips_alongside_spawns(
                service.url, auth, client, sandbox_id, EXEC_ROUNDS
            )
            spawn_true = spawn_inside_seconds(client, sandbox_id, ["true"])
            httpx_round_trip = _stats([_timed(lambda: _exec(client, sandbox_id, "true")) for _ in range(EXEC_REPEATS)])

            stream, pipe = exec_stream_alongside_pipe(service.url, auth, sandbox_id, STREAM_BYTES)
            httpx_stream = exec_stream_mb_s(client, sandbox_id, STREAM_BYTES)

            # The 1 GiB transfers go first, so the growth is measured from the server's RSS before
            # any file went through it (an allocator keeps what it once grew to).
            curl = Curl(service.url, auth["Authorization"].removeprefix("Bearer "), workdir)
            curl.prepare(BIG_FILE_BYTES)
            with _PeakRss(service.process.pid) as write_rss:
                curl.write_mb_s(sandbox_id, BIG_FILE_BYTES)
            with _PeakRss(service.process.pid) as read_rss:
                read_rss.before = write_rss.before
                curl.read_mb_s(sandbox_id, BIG_FILE_BYTES)
            curl.prepare(FILE_BYTES)
            write, read, cp = curl.alongside_cp(client, sandbox_id, FILE_BYTES, workdir)
            curl.source.unlink()
            httpx_write = write_file_mb_s(client, sandbox_id, FILE_BYTES)
            httpx_read = read_file_mb_s(client, sandbox_id, FILE_BYTES)
            _exec(client, sandbox_id, "rm -f ~/big")

            ids = [sandbox_id] + [_create(client) for _ in range(9)]
            with _PeakRss(service.process.pid) as concurrent_rss:
                started = time.perf_counter()
                completed = asyncio.run(_concurrent_execs(service.url, auth, ids, 10))
                concurrent_seconds = time.perf_counter() - started
            for each in ids:
                client.delete(f"/api/v1/sandboxes/{each}")

        ms = (1000 * warm[0], 1000 * warm[1], 1000 * warm[2])
        cold_ms = (1000 * cold[0], 1000 * cold[1], 1000 * cold[2])
        bwrap_ms = (1000 * bwrap[0], 1000 * bwrap[1], 1000 * bwrap[2])
        rt_ms = (1000 * round_trip[0], 1000 * round_trip[1], 1000 * round_trip[2])
        results = {
            "bare_bwrap_ms": bwrap_ms[0],
            "create_first_exec_warm_ms": ms[0],
            "bare_bwrap_alongside_warm_ms": 1000 * warm_bwrap[0],
            "create_first_exec_warm_ratio": warm[0] / warm_bwrap[0],
            "create_first_exec_warm_httpx_ms": 1000 * warm_httpx[0],
            "create_first_exec_warm_httpx_ratio": warm_httpx[0] / warm_httpx_bwrap[0],
            "create_first_exec_cold_ms": cold_ms[0],
            "create_first_exec_cold_ratio": cold[0] / cold_bwrap[0],
            "exec_round_trip_ms": rt_ms[0],
            "spawn_bash_true_inside_ms": 1000 * spawn_bash,
            "spawn_true_inside_ms": 1000 * spawn_true,
            "exec_round_trip_ratio": round_trip[0] / spawn_bash,
            "exec_round_trip_httpx_ms": 1000 * httpx_round_trip[0],
            "exec_stream_mb_s": stream[0],
            "raw_pipe_mb_s": pipe[0],
            "exec_stream_ratio": stream[0] / pipe[0],
            "exec_stream_httpx_mb_s": httpx_stream,
            "write_file_mb_s": write[0],
            "read_file_mb_s": read[0],
            "cp_mb_s": cp[0],
            "write_file_httpx_mb_s": httpx_write[0],
            "read_file_httpx_mb_s": httpx_read[0],
            "write_file_ratio": write[0] / cp[0],
            "read_file_ratio": read[0] / cp[0],
            "write_1gib_rss_growth_mb": write_rss.growth / MB,
            "read_1gib_rss_growth_mb": read_rss.growth / MB,
            "concurrent_execs_completed": float(completed),
            "concurrent_execs_seconds": concurrent_seconds,
            "concurrent_execs_peak_rss_mb": concurrent_rss.peak / MB,
            "concurrent_execs_rss_growth_mb": concurrent_rss.growth / MB,
        }

        print(
            f"\n{'figure':<38} {'median':>10} {'unit':<5} ({'min..max':>17})  {'bare limit':>14}  {'ratio':>7}  target"
        )
        _row("bare bwrap ... sh -c true", bwrap_ms, "ms", None, None, "(30 in a row, before the rest)")
        _row(
            "(a) create -> first exec, warm pool", ms, "ms", _ms(warm_bwrap), warm[0] / warm_bwrap[0], "<= 3, < 100 ms"
        )
        print(f"{'':<38} (the bare bwrap run alternately with each create, so both see the same machine)")
        print(
            f"{'':<38} with httpx as the client: {1000 * warm_httpx[0]:.3g} ms "
            f"(ratio {warm_httpx[0] / warm_httpx_bwrap[0]:.3g})"
        )
        _row("(a) create -> first exec, cold", cold_ms, "ms", _ms(cold_bwrap), cold[0] / cold_bwrap[0], "(no pool)")
        _row("(b) exec `true` round trip", rt_ms, "ms", (1000 * spawn_bash,) * 3, round_trip[0] / spawn_bash, "<= 2")
        print(f"{'':<38} (bare limit: `bash -c true` spawned inside; every exec runs its command as bash -c)")
        print(f"{'':<38} bare `true` spawn inside: {1000 * spawn_true:.3g} ms (ratio {round_trip[0] / spawn_true:.3g})")
        print(
            f"{'':<38} with httpx as the client: {1000 * httpx_round_trip[0]:.3g} ms "
            f"(ratio {httpx_round_trip[0] / spawn_bash:.3g})"
        )
        _row("(c) exec stdout throughput", stream, "MB/s", pipe, stream[0] / pipe[0], ">= 0.3")
        print(f"{'':<38} with httpx as the client: {httpx_stream:.4g} MB/s (ratio {httpx_stream / pipe[0]:.3g})")
        _row("(d) write-file", write, "MB/s", cp, write[0] / cp[0], ">= 0.5")
        _row("(d) read-file", read, "MB/s", cp, read[0] / cp[0], ">= 0.5")
        _row("    write-file, httpx client", httpx_write, "MB/s", cp, httpx_write[0] / cp[0], "")
        _row("    read-file, httpx client", httpx_read, "MB/s", cp, httpx_read[0] / cp[0], "")
        for name, sampler in (("(d) RSS growth, 1 GiB write", write_rss), ("(d) RSS growth, 1 GiB read", read_rss)):
            _row(name, (sampler.growth / MB,) * 3, "MB", None, None, "< 50 MB")
        print(
            f"(e) 100 concurrent execs / 10 sandboxes: {completed}/100 completed in {concurrent_seconds:.2f} s, "
            f"server peak RSS {concurrent_rss.peak / MB:.0f} MB (+{concurrent_rss.growth / MB:.0f} MB)"
        )
        return results
    finally:
        for service in services:
            service.stop()
        from sandboxes.runtimes.local import LocalRuntime, LocalRuntimeConfig

        # Whatever a failed run left running dies with its state directory.
        leftovers = LocalRuntime(LocalRuntimeConfig(root=workdir / "var" / "sandboxes"))
        for info in leftovers.list():
            leftovers.destroy(info.sandbox_id)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key} = {value:.4g}")
