"""Exec through the daemon inside a real sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandboxd.protocol import TIMEOUT_EXIT_CODE
from sandboxes.daemon_client import (
    DaemonClient,
    DaemonError,
    ExecExit,
    ExecOutput,
    ExecStarted,
    TextDecoder,
)
from sandboxes.runtimes.base import SandboxHandle


async def test_output_is_streamed_as_produced(client: DaemonClient) -> None:
    started = time.monotonic()
    first_output_at = None
    lines = []
    async for event in client.exec("echo a; sleep 2; echo b"):
        if isinstance(event, ExecOutput):
            if first_output_at is None:
                first_output_at = time.monotonic() - started
            lines.append(event.data)
        elif isinstance(event, ExecExit):
            assert event.exit_code == 0
    total = time.monotonic() - started
    assert b"".join(lines) == b"a\nb\n"
    assert first_output_at is not None and first_output_at < 1.0
    assert total >= 2.0


async def test_events_start_with_pid_and_end_with_exit(client: DaemonClient) -> None:
    events = [event async for event in client.exec("echo out; echo err >&2; exit 7")]
    assert isinstance(events[0], ExecStarted) and events[0].pid > 1
    assert events[-1] == ExecExit(exit_code=7, timed_out=False, signal=None)
    stdout = b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream == "stdout")
    stderr = b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream == "stderr")
    assert (stdout, stderr) == (b"out\n", b"err\n")


async def test_a_silent_command_is_reported_started_while_it_runs(client: DaemonClient) -> None:
    # "started" may wait for the first output or the exit, but only a few milliseconds: a command
    # that prints nothing for seconds is still known to run long before it ends.
    events = client.exec("sleep 3")
    first = await asyncio.wait_for(anext(aiter(events)), 1.5)
    assert isinstance(first, ExecStarted) and first.pid > 1
    await events.aclose()  # type: ignore[attr-defined]


async def test_killed_by_signal_reports_128_plus_signal(client: DaemonClient) -> None:
    events = [event async for event in client.exec("kill -KILL $$")]
    assert events[-1] == ExecExit(exit_code=137, timed_out=False, signal="SIGKILL")


async def test_timeout_kills_the_whole_process_group(client: DaemonClient) -> None:
    started = time.monotonic()
    result = await client.run("sleep 300 & echo $! > /tmp/bg.pid; sleep 300", timeout=1)
    assert time.monotonic() - started < 5
    assert result.timed_out
    assert result.exit_code == TIMEOUT_EXIT_CODE
    check = await client.run("kill -0 $(cat /tmp/bg.pid) 2>/dev/null && echo alive || echo gone")
    assert check.text == "gone\n"


async def test_disconnecting_cancels_the_command(client: DaemonClient) -> None:
    events = client.exec("sleep 300 & echo $!; sleep 300")
    background_pid = None
    async for event in events:
        if isinstance(event, ExecOutput):
            background_pid = int(event.data)
            break
    await events.aclose()  # type: ignore[attr-defined]
    assert background_pid is not None
    for _ in range(100):
        check = await client.run(f"kill -0 {background_pid} 2>/dev/null && echo alive || echo gone")
        if check.text == "gone\n":
            break
        await asyncio.sleep(0.05)
    assert check.text == "gone\n"


async def test_task_cancellation_cancels_the_command(client: DaemonClient) -> None:
    marker = "/tmp/cancel-marker"

    async def consume() -> None:
        async for _ in client.exec(f"echo $$ > {marker}; sleep 300"):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        check = await client.run(f"kill -0 $(cat {marker}) 2>/dev/null && echo alive || echo gone")
        if check.text == "gone\n":
            break
        await asyncio.sleep(0.05)
    assert check.text == "gone\n"


async def test_one_mebibyte_command(client: DaemonClient) -> None:
    payload = "a" * (1024 * 1024)
    result = await client.run(f"x='{payload}'; echo ${{#x}}")
    assert result.exit_code == 0, result.stderr
    assert result.text == "1048576\n"


async def test_large_command_does_not_leak_its_descriptor(client: DaemonClient) -> None:
    padding = "#" + "p" * 200_000 + "\n"
    result = await client.run(padding + "ls /proc/self/fd | wc -l")
    assert result.exit_code == 0
    # stdin, stdout, stderr and the descriptor ls opens for the listing.
    assert int(result.text) == 4


async def test_utf8_split_across_chunks_is_decoded_whole(client: DaemonClient) -> None:
    chunks = []
    async for event in client.exec(r"printf '\xe2\x82'; sleep 0.3; printf '\xac and \xff\xfe\n'"):
        if isinstance(event, ExecOutput):
            chunks.append(event.data)
    assert len(chunks) >= 2, "the two halves should arrive separately"
    decoder = TextDecoder()
    text = "".join(decoder.decode(chunk) for chunk in chunks) + decoder.flush()
    assert text == "€ and \ufffd\ufffd\n"


async def test_stdin_is_empty(client: DaemonClient) -> None:
    result = await client.run("cat; echo done", timeout=10)
    assert result.text == "done\n"
    assert not result.timed_out


async def test_background_process_survives_the_exec(client: DaemonClient) -> None:
    started = time.monotonic()
    result = await client.run("nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & echo started")
    assert result.text == "started\n"
    assert time.monotonic() - started < 3
    probe = (
        "for i in $(seq 50); do "
        "python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8123/\", timeout=1)' "
        "2>/dev/null && { echo up; exit 0; }; sleep 0.1; done; echo down"
    )
    assert (await client.run(probe)).text == "up\n"


async def test_background_process_holding_the_pipes_does_not_block(client: DaemonClient) -> None:
    started = time.monotonic()
    result = await client.run("sleep 120 & echo $!")
    assert time.monotonic() - started < 3
    pid = int(result.text)
    check = await client.run(f"kill -0 {pid} && echo alive")
    assert check.text == "alive\n"
    await client.run(f"kill {pid}")


async def test_environment(client: DaemonClient, sandbox: SandboxHandle) -> None:
    result = await client.run('echo "$HOME|$USER|$PATH"; pwd; id -u; id -un; hostname')
    home, user, path = result.text.splitlines()[0].split("|")
    assert (home, user) == ("/home/ubuntu", "ubuntu")
    assert "/usr/bin" in path.split(":") and "/opt/svc/bin" in path.split(":")
    assert result.text.splitlines()[1:] == ["/home/ubuntu", "1000", "ubuntu", sandbox.sandbox_id]


async def test_service_environment_does_not_leak(client: DaemonClient) -> None:
    result = await client.run("env")
    assert "DJANGO_SETTINGS_MODULE" not in result.text
    assert "SANDBOXD_SECRET" not in result.text


async def test_workdir(client: DaemonClient) -> None:
    result = await client.run("mkdir -p /tmp/wd && cd /tmp/wd && pwd")
    assert result.text == "/tmp/wd\n"
    assert (await client.run("pwd", workdir="/tmp/wd")).text == "/tmp/wd\n"
    with pytest.raises(DaemonError) as missing:
        await client.run("pwd", workdir="/nonexistent/dir")
    assert missing.value.code == "workdir_missing"
    with pytest.raises(DaemonError) as relative:
        await client.run("pwd", workdir="tmp")
    assert relative.value.code == "invalid_path"


async def test_credentials_reach_later_execs_and_the_config_file(client: DaemonClient) -> None:
    await client.update_credentials({"SVC_API_KEY": "k-123"}, config={"apiKey": "k-123", "baseUrl": "http://x"})
    result = await client.run('echo "$SVC_API_KEY"; stat -c %a ~/.svc.config; cat ~/.svc.config')
    lines = result.text.splitlines()
    assert lines[0] == "k-123"
    assert lines[1] == "600"
    assert '"apiKey": "k-123"' in result.text
    await client.update_credentials({"SVC_API_KEY": "k-456"})
    assert (await client.run('echo "$SVC_API_KEY"')).text == "k-456\n"


async def test_wrong_secret_is_refused(sandbox: SandboxHandle) -> None:
    intruder = DaemonClient(sandbox.address, "not-the-secret-at-all")
    with pytest.raises(DaemonError) as refused:
        await intruder.ping()
    assert refused.value.code == "unauthorized"


async def test_ping(client: DaemonClient, sandbox: SandboxHandle) -> None:
    pong = await client.ping()
    assert pong["type"] == "pong"
    assert pong["hostname"] == sandbox.sandbox_id
    assert pong["pid"] == 1


async def test_output_flood_streams_everything(client: DaemonClient) -> None:
    size = 64 * 1024 * 1024
    received = 0
    largest = 0
    async for event in client.exec(f"head -c {size} /dev/zero"):
        if isinstance(event, ExecOutput):
            received += len(event.data)
            largest = max(largest, len(event.data))
    assert received == size
    assert largest <= 1024 * 1024


async def test_concurrent_execs(client: DaemonClient) -> None:
    results = await asyncio.gather(*(client.run(f"sleep 0.2; echo {i}") for i in range(20)))
    assert [r.text for r in results] == [f"{i}\n" for i in range(20)]
