"""Streamed exec on real sandboxes: framing, timing, errors, cancellation, audit."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from audit.models import AuditEvent, EventType
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_output_exit_code_and_environment(api: httpx.Client, sandbox_id: str) -> None:
    lines = exec_lines(api, sandbox_id, 'echo "$HOME $USER"; id -u; pwd; echo oops >&2; exit 3')
    assert lines[-1] == {"type": "done", "exitCode": 3}
    assert stdout_of(lines) == "/home/ubuntu ubuntu\n1000\n/home/ubuntu\n"
    assert {"type": "stderr", "data": "oops\n"} in lines
    path = stdout_of(exec_lines(api, sandbox_id, "echo $PATH"))
    assert "/usr/bin" in path and "/bin" in path


def test_first_line_arrives_before_the_command_ends(api: httpx.Client, sandbox_id: str) -> None:
    started = time.monotonic()
    arrivals = []
    with api.stream(
        "POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": "echo a; sleep 3; echo b"}
    ) as response:
        for line in response.iter_lines():
            arrivals.append((time.monotonic() - started, json.loads(line)))
    assert arrivals[0][1] == {"type": "stdout", "data": "a\n"}
    assert arrivals[0][0] < 1.5, arrivals
    assert arrivals[-1][0] >= 3.0
    assert arrivals[-1][1] == {"type": "done", "exitCode": 0}


def test_workdir(api: httpx.Client, sandbox_id: str) -> None:
    assert stdout_of(exec_lines(api, sandbox_id, "pwd", workdir="/tmp")) == "/tmp\n"
    lines = exec_lines(api, sandbox_id, "pwd", workdir="/home/ubuntu/missing")
    assert lines[0]["type"] == "error" and "/home/ubuntu/missing" in lines[0]["data"]
    assert lines[-1] == {"type": "done", "exitCode": -1}


def test_timeout_kills_the_process_group(api: httpx.Client, sandbox_id: str) -> None:
    started = time.monotonic()
    lines = exec_lines(api, sandbox_id, "(sleep 60; echo late > /tmp/late) & sleep 60", timeout=1)
    assert time.monotonic() - started < 20
    assert lines[-1] == {"type": "done", "exitCode": 124}
    assert any(line["type"] == "error" and "timed out" in line["data"] for line in lines)
    # The child in the same group was killed with it.
    ps = stdout_of(exec_lines(api, sandbox_id, "ps -eo args"))
    assert "sleep 60" not in ps


def test_utf8_is_never_split_and_bad_bytes_do_not_break_the_stream(api: httpx.Client, sandbox_id: str) -> None:
    # Write "é" (2 bytes) and "€" (3 bytes) one byte at a time, flushing between bytes.
    script = (
        "import sys,time\n"
        "data = ('é€' * 200).encode() + b'\\xff\\xfe tail'\n"
        "for i in range(len(data)):\n"
        "    sys.stdout.buffer.write(data[i:i+1]); sys.stdout.buffer.flush()\n"
        "    if i % 97 == 0: time.sleep(0.001)\n"
    )
    written = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/write-file",
        params={"path": "/tmp/drip.py"},
        content=script.encode(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert written.status_code == 200
    lines = exec_lines(api, sandbox_id, "python3 /tmp/drip.py")
    text = stdout_of(lines)
    assert text == "é€" * 200 + "\ufffd\ufffd tail"
    assert lines[-1] == {"type": "done", "exitCode": 0}


def test_a_one_mebibyte_command(api: httpx.Client, sandbox_id: str) -> None:
    payload = "x" * (1024 * 1024)
    lines = exec_lines(api, sandbox_id, f"printf %s '{payload}' | wc -c")
    assert stdout_of(lines).strip() == str(len(payload))
    assert lines[-1]["exitCode"] == 0


def test_background_processes_outlive_the_exec(api: httpx.Client, sandbox_id: str) -> None:
    exec_lines(api, sandbox_id, "nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &")
    fetch = "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8765/').status)\""
    result = wait_for(lambda: stdout_of(exec_lines(api, sandbox_id, f"sleep 0.3; {fetch}")).strip() == "200")
    assert result


def test_disconnecting_cancels_the_command(api: httpx.Client, sandbox_id: str) -> None:
    command = "echo started; sleep 30; touch /tmp/should-not-exist"
    with api.stream("POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": command}) as response:
        for line in response.iter_lines():
            assert json.loads(line) == {"type": "stdout", "data": "started\n"}
            break
    # The client is gone: the process group must be killed, not left to finish.
    assert wait_for(lambda: "sleep 30" not in stdout_of(exec_lines(api, sandbox_id, "ps -eo args")))
    assert stdout_of(exec_lines(api, sandbox_id, "ls /tmp")).count("should-not-exist") == 0


def test_flooding_output_arrives_complete(api: httpx.Client, sandbox_id: str) -> None:
    total = 0
    with api.stream(
        "POST", f"/api/v1/sandboxes/{sandbox_id}/exec", json={"command": "head -c 50000000 /dev/zero | tr '\\0' 'a'"}
    ) as response:
        for line in response.iter_lines():
            event = json.loads(line)
            if event["type"] == "stdout":
                total += len(event["data"])
            last = event
    assert total == 50_000_000
    assert last == {"type": "done", "exitCode": 0}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": ""}, "command"),
        ({}, "command"),
        ({"command": "true", "timeout": 0}, "timeout"),
        ({"command": "true", "timeout": -5}, "timeout"),
        ({"command": "true", "timeout": 10**9}, "timeout"),
        ({"command": "true", "timeout": "soon"}, "timeout"),
        ({"command": "true", "workdir": "relative/dir"}, "workdir"),
        ({"command": "true", "shell": "zsh"}, "shell"),
        ({"command": 42}, "command"),
        ({"command": "a\x00b"}, "command"),
        ({"command": "true", "timeout": True}, "timeout"),
        ({"command": "true", "workdir": None}, "workdir"),
    ],
)
def test_bad_exec_requests_are_400(api: httpx.Client, sandbox_id: str, body: dict[str, object], field: str) -> None:
    response = api.post(f"/api/v1/sandboxes/{sandbox_id}/exec", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert field in error["details"]["fields"]


def test_malformed_json_and_wrong_method(api: httpx.Client, sandbox_id: str) -> None:
    bad = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/exec", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "malformed_request"
    wrong = api.get(f"/api/v1/sandboxes/{sandbox_id}/exec")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    missing = api.post("/api/v1/sandboxes/sbx_nope/exec", json={"command": "true"})
    assert missing.status_code == 404


def test_exec_is_audited_with_output_and_exit_code(api: httpx.Client, sandbox_id: str) -> None:
    exec_lines(api, sandbox_id, "echo out; echo err >&2; exit 7")
    event = wait_for(lambda: AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.EXEC).first())
    data = event.data
    assert data["command"] == "echo out; echo err >&2; exit 7"
    assert data["stdout"] == "out\n" and data["stderr"] == "err\n"
    assert data["exitCode"] == 7 and data["workdir"] == "/home/ubuntu"
    assert data["stdoutBytes"] == 4 and data["stdoutTruncated"] is False
    assert data["durationMs"] >= 0
    assert event.actor_email and event.token_prefix and event.client_address == "127.0.0.1"
    listed = api.get(f"/api/v1/sandboxes/{sandbox_id}/audit-logs?type=sandbox.exec").json()["results"]
    assert listed[0]["data"]["exitCode"] == 7
