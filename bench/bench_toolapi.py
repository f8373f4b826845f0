"""Tool HTTP API against mcpo, side by side on one upstream, plus openapi.json for 1,000 tools.

Starts, each in its own process: an upstream MCP server (streamable HTTP), this service the way
`make run` serves it (uvicorn, `--lifespan off`; BENCH_TOOLAPI_SERVER=daphne measures it under daphne
instead) with production settings (SVC_ENV=production, so DEBUG off; fresh SQLite state in a
temporary directory) and mcpo under uvicorn (installed from PyPI into its own virtualenv,
var/bench-mcpo-venv, on first use). Both proxies call the same upstream tool with the same arguments.

Fairness on a shared machine: both are warmed up, then measured in ROUNDS rounds. In each round the
sequential calls alternate between the two request by request, and the concurrent load alternates
between them in SLICES short bursts each (who goes first alternating too), so load from anything
else running lands on both equally. Latency percentiles are over all rounds' samples; calls/s is the
median of rounds. Each round's ratios are printed too, so the spread is visible.

Figures: tool call p50/p99 latency (one caller at a time) and calls/s (CONCURRENCY callers) for each,
ours divided by mcpo's (latency ratio target <= 1.0), and the time to serve a warm openapi.json
describing 1,000 tools (target < 100 ms).

Standalone: .venv/bin/python -m bench.bench_toolapi
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import signing_key_file
from common import http_server

ROOT = Path(__file__).resolve().parent.parent
MCPO_VERSION = "0.0.20"
# mcpo 0.0.20 imports the 1.x client API (streamablehttp_client), removed in mcp 2, and passes extra
# keyword arguments to FastAPI(), which later FastAPI releases refuse.
MCPO_MCP_VERSION = "1.30.0"
MCPO_FASTAPI_VERSION = "0.128.0"
MCPO_VENV = ROOT / "var" / "bench-mcpo-venv"
WARMUP = 100
ROUNDS = 5
SEQUENTIAL_CALLS = 200  # per proxy and round
CONCURRENT_CALLS = 1000  # per proxy and round
SLICES = 5  # bursts the concurrent calls of a round are split into, alternating between the proxies
CONCURRENCY = 16
OPENAPI_TOOLS = 1000
OPENAPI_REQUESTS = 50


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited\n{log.read_text(errors='replace')[-3000:]}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up\n{log.read_text(errors='replace')[-3000:]}")


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- upstream (runs in its own process: `python -m bench.bench_toolapi upstream PORT TOOLS`) ----------


def serve_upstream(port: int, extra_tools: int) -> None:
    import logging

    import mcp_types as types
    import uvicorn
    from mcp.server import Server

    logging.disable(logging.INFO)
    tools = [
        types.Tool(
            name="add",
            description="Add two integers.",
            input_schema={
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        )
    ]
    for index in range(extra_tools):
        tools.append(
            types.Tool(
                name=f"tool_{index:04d}",
                description=f"Generated tool number {index}.",
                input_schema={
                    "type": "object",
                    "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}}},
                    "properties": {
                        "mode": {"type": "string", "enum": ["fast", "slow"], "description": "How"},
                        "count": {"type": "integer", "minimum": 1, "maximum": 100, "default": 1},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                    },
                    "required": ["mode"],
                },
            )
        )

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        total = int(args.get("a", 0)) + int(args.get("b", 0))
        return types.CallToolResult(content=[types.TextContent(text=str(total))], structured_content={"result": total})

    server = Server("bench-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


# -- mcpo ---------------------------------------------------------------------------------------------


def _mcpo_binary() -> Path:
    binary = MCPO_VENV / "bin" / "mcpo"
    pins = [f"mcpo=={MCPO_VERSION}", f"mcp=={MCPO_MCP_VERSION}", f"fastapi=={MCPO_FASTAPI_VERSION}"]
    check = (
        subprocess.run(
            [
                str(MCPO_VENV / "bin" / "python"),
                "-c",
                f"import fastapi, mcpo.main; assert fastapi.__version__ == {MCPO_FASTAPI_VERSION!r}",
            ],
            capture_output=True,
        )
        if binary.exists()
        else None
    )
    if check is None or check.returncode != 0:
        print(f"installing {' '.join(pins)} into {MCPO_VENV}", flush=True)
        if not binary.exists():
            subprocess.run([sys.executable, "-m", "venv", str(MCPO_VENV)], check=True)
        subprocess.run([str(MCPO_VENV / "bin" / "pip"), "install", "-q", *pins], check=True)
    return binary


# -- load ---------------------------------------------------------------------------------------------


BODY = {"a": 1, "b": 2}
Target = tuple[str, dict[str, str]]  # URL, headers


def _client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(timeout=30, limits=limits)


async def _call(client: httpx.AsyncClient, target: Target) -> float:
    started = time.perf_counter()
    response = await client.post(target[0], json=BODY, headers=target[1])
    elapsed = time.perf_counter() - started
    if response.is_error:
        raise RuntimeError(f"{target[0]}: {response.status_code} {response.text[:500]}")
    return elapsed


async def _sequential(ours: Target, theirs: Target, calls: int) -> tuple[list[float], list[float]]:
    """One caller, alternating between the two request by request (and which goes first)."""
    mine: list[float] = []
    other: list[float] = []
    async with _client(1) as client:
        for index in range(calls):
            pair = [(ours, mine), (theirs, other)]
            for target, latencies in pair if index % 2 == 0 else reversed(pair):
                latencies.append(await _call(client, target))
    return mine, other


async def _burst(client: httpx.AsyncClient, target: Target, calls: int, concurrency: int) -> float:
    """Seconds ``calls`` calls take with ``concurrency`` callers."""
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await _call(client, target)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def _throughputs(ours: Target, theirs: Target, first_ours: bool) -> tuple[float, float]:
    """Calls/s of each, from alternating bursts."""
    elapsed = {id(ours): 0.0, id(theirs): 0.0}
    async with _client(CONCURRENCY) as mine, _client(CONCURRENCY) as other:
        clients = {id(ours): mine, id(theirs): other}
        for target in (ours, theirs):  # open the connections first
            await _burst(clients[id(target)], target, CONCURRENCY, CONCURRENCY)
        for index in range(SLICES):
            order = [ours, theirs] if (index % 2 == 0) == first_ours else [theirs, ours]
            for target in order:
                elapsed[id(target)] += await _burst(
                    clients[id(target)], target, CONCURRENT_CALLS // SLICES, CONCURRENCY
                )
    calls = CONCURRENT_CALLS // SLICES * SLICES
    return calls / elapsed[id(ours)], calls / elapsed[id(theirs)]


async def _warm_up(ours: Target, theirs: Target) -> None:
    async with _client(1) as client:
        for _ in range(WARMUP):
            await _call(client, ours)
            await _call(client, theirs)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _compare(ours: Target, theirs: Target) -> dict[str, float]:
    asyncio.run(_warm_up(ours, theirs))
    mine_all: list[float] = []
    other_all: list[float] = []
    mine_rates: list[float] = []
    other_rates: list[float] = []
    p50_ratios: list[float] = []
    rate_ratios: list[float] = []
    for round_number in range(ROUNDS):
        mine, other = asyncio.run(_sequential(ours, theirs, SEQUENTIAL_CALLS))
        mine_rate, other_rate = asyncio.run(_throughputs(ours, theirs, first_ours=round_number % 2 == 0))
        mine_all += mine
        other_all += other
        mine_rates.append(mine_rate)
        other_rates.append(other_rate)
        p50_ratios.append(_percentile(mine, 0.5) / _percentile(other, 0.5))
        rate_ratios.append(mine_rate / other_rate)
        print(
            f"round {round_number + 1}: p50 {_percentile(mine, 0.5) * 1000:.2f} vs {_percentile(other, 0.5) * 1000:.2f} ms"
            f" (ratio {p50_ratios[-1]:.3f}), calls/s {mine_rate:.0f} vs {other_rate:.0f} (ratio {rate_ratios[-1]:.3f})",
            flush=True,
        )
    return {
        "ours_p50_ms": _percentile(mine_all, 0.50) * 1000,
        "ours_p99_ms": _percentile(mine_all, 0.99) * 1000,
        "ours_calls_per_s": statistics.median(mine_rates),
        "mcpo_p50_ms": _percentile(other_all, 0.50) * 1000,
        "mcpo_p99_ms": _percentile(other_all, 0.99) * 1000,
        "mcpo_calls_per_s": statistics.median(other_rates),
        "p50_ratio_min": min(p50_ratios),
        "p50_ratio_max": max(p50_ratios),
        "throughput_ratio_min": min(rate_ratios),
        "throughput_ratio_max": max(rate_ratios),
    }


# -- run ----------------------------------------------------------------------------------------------


def run() -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-toolapi-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        upstream_port, bulk_port, ours_port, mcpo_port = (_free_port() for _ in range(4))
        upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
        bulk_url = f"http://127.0.0.1:{bulk_port}/mcp"
        me = [sys.executable, "-m", "bench.bench_toolapi"]
        processes.append(_spawn([*me, "upstream", str(upstream_port), "0"], workdir / "upstream.log"))
        processes.append(_spawn([*me, "upstream", str(bulk_port), str(OPENAPI_TOOLS)], workdir / "bulk.log"))

        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SVC_ENV": "production",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            "ALLOWED_HOSTS": "127.0.0.1",
            "SVC_VAR_DIR": str(workdir / "var"),
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
        }
        env["OIDC_SIGNING_KEY_FILES"] = signing_key_file(workdir)
        env.pop("DATABASE_URL", None)  # fresh SQLite state: the bench never touches a real database
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
        token = subprocess.run(
            [*manage, "createtoken", "--org", "bench", "--email", "bench@bench.test", "--role", "owner"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        server = os.environ.get("BENCH_TOOLAPI_SERVER", "uvicorn")
        ours_log = workdir / f"{server}.log"
        commands = {
            # As common/management/commands/runall.py (`make run`) starts it.
            "uvicorn": [
                "uvicorn",
                *("--host", "127.0.0.1", "--port", str(ours_port), "--lifespan", "off"),
                *("--http", http_server.PROTOCOL),
            ],
            "daphne": ["daphne", "-b", "127.0.0.1", "-p", str(ours_port)],
        }
        print(f"this service under {server}", flush=True)
        processes.append(_spawn([sys.executable, "-m", *commands[server], "config.asgi:application"], ours_log, env))
        ours = f"http://127.0.0.1:{ours_port}"
        _wait_http(f"{ours}/healthz", processes[-1], ours_log)

        mcpo_log = workdir / "mcpo.log"
        mcpo = [str(_mcpo_binary()), "--host", "127.0.0.1", "--port", str(mcpo_port)]
        processes.append(_spawn([*mcpo, "--server-type", "streamable-http", "--", upstream_url], mcpo_log))
        mcpo_base = f"http://127.0.0.1:{mcpo_port}"
        _wait_http(f"{mcpo_base}/openapi.json", processes[-1], mcpo_log)

        auth = {"Authorization": f"Bearer {token}"}
        for name, url in (("bench", upstream_url), ("bulk", bulk_url)):
            for _ in range(50):  # the upstream processes may still be starting
                response = httpx.post(
                    f"{ours}/api/v1/mcp-servers", json={"name": name, "url": url}, headers=auth, timeout=60
                )
                response.raise_for_status()
                if response.json()["health"] == "ok":
                    break
                httpx.delete(f"{ours}/api/v1/mcp-servers/{response.json()['id']}", headers=auth)
                time.sleep(0.2)
            else:
                raise RuntimeError(f"upstream {name} never became healthy")

        compared = _compare((f"{ours}/api/mcp-httpapi/tools/bench__add", auth), (f"{mcpo_base}/add", {}))

        with httpx.Client(headers=auth, timeout=60) as client:
            started = time.perf_counter()
            cold = client.get(f"{ours}/api/mcp-httpapi/openapi.json")
            cold_ms = (time.perf_counter() - started) * 1000
            cold.raise_for_status()
            operations = len(cold.json()["paths"])
            warm: list[float] = []
            for _ in range(OPENAPI_REQUESTS):
                started = time.perf_counter()
                client.get(f"{ours}/api/mcp-httpapi/openapi.json").raise_for_status()
                warm.append((time.perf_counter() - started) * 1000)

        figures = {
            **compared,
            "p50_latency_ratio": compared["ours_p50_ms"] / compared["mcpo_p50_ms"],
            "p99_latency_ratio": compared["ours_p99_ms"] / compared["mcpo_p99_ms"],
            "throughput_ratio": compared["ours_calls_per_s"] / compared["mcpo_calls_per_s"],
            "openapi_operations": float(operations),
            "openapi_cold_ms": cold_ms,
            "openapi_warm_p50_ms": statistics.median(warm),
            "openapi_warm_max_ms": max(warm),
        }
        for key, value in figures.items():
            print(f"{key:>22} = {value:.3f}", flush=True)
        return figures
    finally:
        for process in reversed(processes):
            _stop(process)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "upstream":
        serve_upstream(int(sys.argv[2]), int(sys.argv[3]))
    else:
        run()
