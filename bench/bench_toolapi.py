"""Tool HTTP API against mcpo, side by side on one upstream, plus openapi.json for 1,000 tools.

Starts, each in its own process: an upstream MCP server (streamable HTTP), this service under daphne
(fresh SQLite state in a temporary directory) and mcpo (installed from PyPI into its own virtualenv,
var/bench-mcpo-venv, on first use). Both proxies call the same upstream tool with the same arguments.

Figures: tool call p50/p99 latency (one caller at a time) and calls/s (CONCURRENCY callers) for each,
ours divided by mcpo's (latency ratio target <= 1.0), and the time to serve a warm openapi.json
describing 1,000 tools (target < 100 ms).

Standalone: .venv/bin/python -m bench.bench_toolapi
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MCPO_VERSION = "0.0.20"
# mcpo 0.0.20 imports the 1.x client API (streamablehttp_client), removed in mcp 2, and passes extra
# keyword arguments to FastAPI(), which later FastAPI releases refuse.
MCPO_MCP_VERSION = "1.30.0"
MCPO_FASTAPI_VERSION = "0.128.0"
MCPO_VENV = ROOT / "var" / "bench-mcpo-venv"
WARMUP = 50
SEQUENTIAL_CALLS = 400
CONCURRENT_CALLS = 2000
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


async def _measure(url: str, headers: dict[str, str], calls: int, concurrency: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    body = {"a": 1, "b": 2}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, timeout=30, limits=limits) as client:
        for _ in range(WARMUP):
            (await client.post(url, json=body)).raise_for_status()
        remaining = calls

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                response = await client.post(url, json=body)
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, calls / elapsed


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _figures(url: str, headers: dict[str, str]) -> dict[str, float]:
    sequential, _ = asyncio.run(_measure(url, headers, SEQUENTIAL_CALLS, 1))
    _, throughput = asyncio.run(_measure(url, headers, CONCURRENT_CALLS, CONCURRENCY))
    return {
        "p50_ms": _percentile(sequential, 0.50) * 1000,
        "p99_ms": _percentile(sequential, 0.99) * 1000,
        "calls_per_s": throughput,
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
            "SVC_VAR_DIR": str(workdir / "var"),
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
        }
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
        ours_log = workdir / "daphne.log"
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(ours_port), "config.asgi:application"]
        processes.append(_spawn(daphne, ours_log, env))
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

        mine = _figures(f"{ours}/api/mcp-httpapi/tools/bench__add", auth)
        theirs = _figures(f"{mcpo_base}/add", {})

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
            "ours_p50_ms": mine["p50_ms"],
            "ours_p99_ms": mine["p99_ms"],
            "ours_calls_per_s": mine["calls_per_s"],
            "mcpo_p50_ms": theirs["p50_ms"],
            "mcpo_p99_ms": theirs["p99_ms"],
            "mcpo_calls_per_s": theirs["calls_per_s"],
            "p50_latency_ratio": mine["p50_ms"] / theirs["p50_ms"],
            "p99_latency_ratio": mine["p99_ms"] / theirs["p99_ms"],
            "throughput_ratio": mine["calls_per_s"] / theirs["calls_per_s"],
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
