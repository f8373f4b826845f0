"""Bidirectional process streams (the web terminal and SSH ride on these)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from sandboxes.daemon_client import DaemonClient, ExecExit, ExecOutput, ProcessStream


async def collect_until(stream: ProcessStream, needle: bytes, seconds: float = 10) -> bytes:
    seen = b""

    async def read() -> None:
        nonlocal seen
        async for event in stream:
            if isinstance(event, ExecOutput):
                seen += event.data
                if needle in seen:
                    return

    await asyncio.wait_for(read(), seconds)
    return seen


async def test_pipe_process_round_trip(client: DaemonClient) -> None:
    stream = await client.open_process(["cat"])
    async with stream:
        await stream.send(b"hello\n")
        await stream.close_stdin()
        output = b""
        exit_event = None
        async for event in stream:
            if isinstance(event, ExecOutput):
                assert event.stream == "stdout"
                output += event.data
            elif isinstance(event, ExecExit):
                exit_event = event
    assert output == b"hello\n"
    assert exit_event == ExecExit(0, False, None)


async def test_pipe_process_keeps_stderr_apart(client: DaemonClient) -> None:
    stream = await client.open_process(command="echo out; echo err >&2; exit 3")
    async with stream:
        events = [event async for event in stream]
    assert ExecOutput("stderr", b"err\n") in events
    assert ExecOutput("stdout", b"out\n") in events
    assert events[-1] == ExecExit(3, False, None)


async def test_pty_has_a_controlling_terminal_and_size(client: DaemonClient) -> None:
    stream = await client.open_process(
        ["bash", "-c", "stty size; tty; test -t 0 && echo IS-A-TTY; echo $TERM"], pty=True, cols=100, rows=30
    )
    async with stream:
        output = b""
        async for event in stream:
            if isinstance(event, ExecOutput):
                output += event.data
    text = output.decode().replace("\r", "")
    assert "30 100" in text
    assert "/dev/pts/" in text
    assert "IS-A-TTY" in text
    assert "xterm-256color" in text


async def test_pty_resize_and_interactive_shell(client: DaemonClient) -> None:
    stream = await client.open_process(pty=True, cols=80, rows=24)
    async with stream:
        await stream.resize(120, 40)
        await asyncio.sleep(0.1)
        await stream.send(b"stty size; echo MARK-$((6*7))\n")
        seen = await collect_until(stream, b"MARK-42")
        assert b"40 120" in seen
        await stream.send(b"exit 5\n")
        exit_event = None
        async for event in stream:
            if isinstance(event, ExecExit):
                exit_event = event
        assert exit_event is not None and exit_event.exit_code == 5


async def test_ctrl_c_interrupts_the_foreground_command(client: DaemonClient) -> None:
    stream = await client.open_process(pty=True)
    async with stream:
        await stream.send(b"sleep 100; echo after-$((1+1))\n")
        await asyncio.sleep(0.5)
        await stream.send(b"\x03")
        await stream.send(b"echo back-$((2+2))\n")
        seen = await collect_until(stream, b"back-4")
        assert b"after-2" not in seen


async def test_hanging_up_kills_the_process(client: DaemonClient) -> None:
    stream = await client.open_process(command="echo $$; exec sleep 300")
    first = await collect_until(stream, b"\n")
    pid = int(first.split()[0])
    await stream.aclose()
    for _ in range(100):
        check = await client.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        if check.text == "gone\n":
            break
        await asyncio.sleep(0.05)
    assert check.text == "gone\n"


@pytest.mark.skipif(
    shutil.which("sshd") is None and not __import__("os").path.exists("/usr/sbin/sshd"), reason="no sshd"
)
async def test_sshd_speaks_over_a_process_stream(client: DaemonClient) -> None:
    setup = await client.run(
        "mkdir -p ~/.ssh-test && ssh-keygen -q -t ed25519 -N '' -f ~/.ssh-test/host_key <<< y >/dev/null; echo ok"
    )
    assert setup.text.endswith("ok\n"), setup.stderr
    stream = await client.open_process(
        ["/usr/sbin/sshd", "-i", "-e", "-f", "/dev/null", "-h", "/home/ubuntu/.ssh-test/host_key", "-o", "PidFile=none"]
    )
    async with stream:
        await stream.send(b"SSH-2.0-probe\r\n")
        seen = await collect_until(stream, b"\r\n")
        assert seen.startswith(b"SSH-2.0-OpenSSH")
