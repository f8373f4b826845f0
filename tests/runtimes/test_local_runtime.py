"""Lifecycle, limits and isolation of the bubblewrap runtime, asserted from outside the sandbox."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandboxes.daemon_client import DaemonClient
from sandboxes.runtimes.base import (
    InvalidSandboxIdError,
    SandboxCreateError,
    SandboxHandle,
    SandboxRuntime,
    SandboxState,
)
from sandboxes.runtimes.local import GIB, LocalRuntime, LocalRuntimeConfig, _proc_start_time
from tests.runtimes.conftest import ServiceStub, new_sandbox_id


def _state(runtime: LocalRuntime, sandbox_id: str) -> dict:
    state = runtime._read_state(runtime.root / sandbox_id)
    assert state is not None
    return state


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{name} missing")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie waits for whichever init adopted it)."""
    try:
        return _status_field(pid, "State")[0] != "Z"
    except OSError:
        return False


def _cgroups_removed(state: dict) -> bool:
    return not any(os.path.exists(cgroup) for cgroup in state["cgroups"])


@pytest.fixture(scope="module")
def neighbour(local_runtime: LocalRuntime) -> Iterator[SandboxHandle]:
    handle = local_runtime.create(new_sandbox_id("n"))
    yield handle
    local_runtime.destroy(handle.sandbox_id)


def test_runtime_satisfies_the_protocol(local_runtime: LocalRuntime) -> None:
    assert isinstance(local_runtime, SandboxRuntime)


def test_capabilities_report_every_limit(local_runtime: LocalRuntime) -> None:
    caps = local_runtime.capabilities().as_dict()
    assert caps["available"] is True
    names = {limit["name"] for limit in caps["limits"]}
    assert {"cpu", "memory", "pids", "user", "network"} <= names
    for limit in caps["limits"]:
        # Either enforced, or it says why not: never silently skipped.
        assert limit["enforced"] or limit["detail"]


async def test_user_inside_is_ubuntu_and_host_side_is_unprivileged(
    local_runtime: LocalRuntime, sandbox: SandboxHandle, client: DaemonClient
) -> None:
    assert (await client.run("id -u; id -g; id -un")).text == "1000\n1000\nubuntu\n"
    init_pid = _state(local_runtime, sandbox.sandbox_id)["initPid"]
    host_uids = _status_field(init_pid, "Uid").split()
    assert "0" not in host_uids
    if os.geteuid() == 0:
        assert int(host_uids[0]) >= local_runtime.config.host_uid_base
    caps = _status_field(init_pid, "CapEff")
    assert int(caps, 16) == 0


async def test_each_sandbox_has_its_own_host_uid(
    local_runtime: LocalRuntime, sandbox: SandboxHandle, neighbour: SandboxHandle
) -> None:
    if os.geteuid() != 0:
        pytest.skip("per-sandbox host uids need a root service")
    ours = _state(local_runtime, sandbox.sandbox_id)["hostUid"]
    theirs = _state(local_runtime, neighbour.sandbox_id)["hostUid"]
    assert ours != theirs


async def test_host_processes_are_invisible(client: DaemonClient) -> None:
    result = await client.run("ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '")
    count, init = result.text.splitlines()
    assert int(count) < 10
    assert "sandboxd" in init
    assert str(os.getpid()) not in (await client.run("ls /proc")).text.split()


async def test_host_files_are_out_of_reach(client: DaemonClient, local_runtime: LocalRuntime) -> None:
    result = await client.run(
        "for p in /root /etc/shadow /etc/ssh/ssh_host_ed25519_key /work /var/lib/postgresql "
        f"{local_runtime.root}; do test -e $p && echo present:$p; done; echo checked"
    )
    assert result.text == "checked\n"
    assert (await client.run("touch /usr/bin/x 2>&1; echo $?")).text.strip().endswith("1")


async def test_other_sandboxes_homes_are_out_of_reach(
    local_runtime: LocalRuntime, client: DaemonClient, neighbour: SandboxHandle
) -> None:
    theirs = DaemonClient(neighbour.address, neighbour.secret)
    await theirs.write_file("/home/ubuntu/secret.txt", b"neighbour-secret")
    host_path = local_runtime.root / neighbour.sandbox_id / "home" / "secret.txt"
    assert host_path.exists()
    result = await client.run(f"cat {host_path} 2>&1; grep -rs neighbour-secret /home /tmp /run /var /opt; echo done")
    assert "neighbour-secret" not in result.text
    assert (await client.run("cat ~/secret.txt 2>/dev/null; echo done")).text == "done\n"


@pytest.mark.parametrize("port", [5432, 6379])
async def test_host_loopback_services_are_unreachable(client: DaemonClient, port: int) -> None:
    probe = (
        "import socket,sys\n"
        f"for host in ('127.0.0.1', 'localhost', '::1'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2).close()\n"
        "        print('reached', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host)\n"
    )
    await client.write_file("/tmp/probe.py", probe.encode())
    result = await client.run("python3 /tmp/probe.py")
    assert "reached" not in result.text, result.text


async def test_the_service_port_is_forwarded(
    local_runtime: LocalRuntime, client: DaemonClient, service_stub: ServiceStub
) -> None:
    if local_runtime.capabilities().network.mode != "pasta":
        pytest.skip("only pasta forwards the service port")
    fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{service_stub.port}/', timeout=5).read().decode(), end='')"
    result = await client.run(f'python3 -c "{fetch}"')
    assert result.stdout == service_stub.body


async def test_outbound_network_is_configured(local_runtime: LocalRuntime, client: DaemonClient) -> None:
    network = local_runtime.capabilities().network
    routes = (await client.run("ip route 2>/dev/null || cat /proc/net/route")).text
    if network.outbound:
        assert "default" in routes or "00000000" in routes
    else:
        assert "default" not in routes


async def test_limits_are_applied_to_the_cgroups(local_runtime: LocalRuntime, sandbox: SandboxHandle) -> None:
    by_name = {limit.name: limit for limit in sandbox.limits}
    assert set(by_name) == {"cpu", "memory", "pids"}
    cgroups = [Path(p) for p in _state(local_runtime, sandbox.sandbox_id)["cgroups"]]
    init_pid = _state(local_runtime, sandbox.sandbox_id)["initPid"]
    for path in cgroups:
        assert str(init_pid) in (path / "cgroup.procs").read_text().split()
    files = {p.name: p for cg in cgroups for p in cg.iterdir()}
    if by_name["memory"].enforced:
        limit_file = files.get("memory.limit_in_bytes") or files["memory.max"]
        assert int(limit_file.read_text()) == local_runtime.config.memory_bytes
    if by_name["pids"].enforced:
        assert int(files["pids.max"].read_text()) == local_runtime.config.pids_max
    if by_name["cpu"].enforced:
        if "cpu.cfs_quota_us" in files:
            assert int(files["cpu.cfs_quota_us"].read_text()) == int(files["cpu.cfs_period_us"].read_text())
        else:
            quota, period = files["cpu.max"].read_text().split()
            assert quota == period


async def test_memory_bomb_is_killed_inside_while_the_sandbox_survives(
    local_runtime: LocalRuntime, sandbox: SandboxHandle, client: DaemonClient
) -> None:
    if not {limit.name: limit for limit in sandbox.limits}["memory"].enforced:
        pytest.skip("memory limit not enforceable here")
    result = await client.run("python3 -c \"b = bytearray(3 * 1024**3); print('survived')\"", timeout=60)
    assert result.exit_code != 0
    assert "survived" not in result.text
    assert (await client.run("echo still-here")).text == "still-here\n"
    assert local_runtime.config.memory_bytes == GIB


async def test_fork_bomb_is_contained(local_runtime: LocalRuntime, client: DaemonClient) -> None:
    """The bombed sandbox suffers; its neighbours and the host do not, and destroy still cleans up."""
    handle = local_runtime.create(new_sandbox_id("b"))
    try:
        if not {limit.name: limit for limit in handle.limits}["pids"].enforced:
            pytest.skip("pids limit not enforceable here")
        bombed = DaemonClient(handle.address, handle.secret)
        started = time.monotonic()
        await bombed.run("bomb() { bomb | bomb & }; bomb; sleep 3", timeout=5)
        assert time.monotonic() - started < 30
        pids_cgroup = next(Path(p) for p in _state(local_runtime, handle.sandbox_id)["cgroups"] if "pids" in p)
        assert int((pids_cgroup / "pids.current").read_text()) <= local_runtime.config.pids_max
        assert (await client.run("echo neighbour-fine")).text == "neighbour-fine\n"
    finally:
        state = _state(local_runtime, handle.sandbox_id)
        local_runtime.destroy(handle.sandbox_id)
    assert not _running(state["initPid"])
    assert _cgroups_removed(state)


def test_list_and_inspect(local_runtime: LocalRuntime, sandbox: SandboxHandle) -> None:
    info = local_runtime.inspect(sandbox.sandbox_id)
    assert info is not None and info.state == SandboxState.RUNNING
    assert info.handle == sandbox
    assert sandbox.sandbox_id in {i.sandbox_id for i in local_runtime.list()}
    assert local_runtime.inspect("never-created") is None


async def test_a_new_runtime_instance_finds_running_sandboxes(
    local_runtime: LocalRuntime, sandbox: SandboxHandle, service_stub: ServiceStub
) -> None:
    """What happens after the web process restarts: state on disk is enough to reach the sandbox."""
    fresh = LocalRuntime(LocalRuntimeConfig(root=local_runtime.root, service_port=service_stub.port))
    info = fresh.inspect(sandbox.sandbox_id)
    assert info is not None and info.state == SandboxState.RUNNING and info.handle is not None
    assert (await DaemonClient(info.handle.address, info.handle.secret).run("echo hi")).text == "hi\n"
    init_pid = _state(local_runtime, sandbox.sandbox_id)["initPid"]
    bwrap_pid = int(_status_field(init_pid, "PPid"))
    # Not our child: the sandbox does not die or turn into our zombie when this process goes away.
    assert int(_status_field(bwrap_pid, "PPid")) != os.getpid()


async def test_destroy_removes_processes_cgroups_and_files(local_runtime: LocalRuntime) -> None:
    handle = local_runtime.create(new_sandbox_id("d"))
    client = DaemonClient(handle.address, handle.secret)
    await client.run("nohup sleep 1000 >/dev/null 2>&1 &")
    state = _state(local_runtime, handle.sandbox_id)
    pasta_pid_file = local_runtime.root / handle.sandbox_id / "net" / "pasta.pid"
    pasta_pid = int(pasta_pid_file.read_text()) if pasta_pid_file.exists() else None
    assert local_runtime.destroy(handle.sandbox_id) is True
    assert not _running(state["initPid"])
    assert _cgroups_removed(state)
    if pasta_pid is not None:
        for _ in range(100):
            if not _running(pasta_pid):
                break
            await asyncio.sleep(0.01)
        assert not _running(pasta_pid)
    assert not (local_runtime.root / handle.sandbox_id).exists()
    assert local_runtime.inspect(handle.sandbox_id) is None
    assert local_runtime.destroy(handle.sandbox_id) is False


def test_exited_sandbox_is_reported_for_reconciliation(local_runtime: LocalRuntime) -> None:
    handle = local_runtime.create(new_sandbox_id("x"))
    try:
        init_pid = _state(local_runtime, handle.sandbox_id)["initPid"]
        os.kill(init_pid, 9)
        for _ in range(200):
            info = local_runtime.inspect(handle.sandbox_id)
            if info is not None and info.state == SandboxState.EXITED:
                break
            time.sleep(0.01)
        assert info is not None and info.state == SandboxState.EXITED
    finally:
        local_runtime.destroy(handle.sandbox_id)


def test_duplicate_and_invalid_ids_are_refused(local_runtime: LocalRuntime, sandbox: SandboxHandle) -> None:
    with pytest.raises(SandboxCreateError):
        local_runtime.create(sandbox.sandbox_id)
    for bad in ("", "UPPER", "../escape", "a" * 64, "-leading"):
        with pytest.raises(InvalidSandboxIdError):
            local_runtime.create(bad)


def test_network_none_mode_fails_closed(runtime_root: Path) -> None:
    runtime = LocalRuntime(LocalRuntimeConfig(root=runtime_root, network="none"))
    assert runtime.capabilities().network.outbound is False
    handle = runtime.create(new_sandbox_id("o"))
    try:
        result = asyncio.run(
            DaemonClient(handle.address, handle.secret).run(
                "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" 2>&1 | tail -1"
            )
        )
        assert "unreachable" in result.text.lower()
    finally:
        runtime.destroy(handle.sandbox_id)


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_concurrent_creates_close_only_their_own_descriptors(local_runtime: LocalRuntime, tmp_path: Path) -> None:
    """Creates from many threads of one process: each descriptor is closed once, by its owner.

    A descriptor closed twice closes whatever another thread opened under the same number in
    between; the canary files opened and read while the creates run would then break or leak.
    """
    baseline = _open_fds()
    stop = threading.Event()
    canary_errors: list[BaseException] = []

    target = tmp_path / "canary"
    target.write_bytes(b"canary" * 1000)

    def canary() -> None:
        while not stop.is_set():
            try:
                with open(target, "rb") as f:
                    for _ in range(20):
                        f.seek(0)
                        assert f.read() == b"canary" * 1000
                        os.fstat(f.fileno())
            except BaseException as exc:
                canary_errors.append(exc)
                return

    watchers = [threading.Thread(target=canary) for _ in range(4)]
    for watcher in watchers:
        watcher.start()
    ids = [new_sandbox_id("p") for _ in range(12)]
    try:
        with ThreadPoolExecutor(max_workers=12) as pool:
            handles = list(pool.map(local_runtime.create, ids))
        assert sorted(h.sandbox_id for h in handles) == sorted(ids)
        for handle in handles:
            info = local_runtime.inspect(handle.sandbox_id)
            assert info is not None and info.state == SandboxState.RUNNING
            assert asyncio.run(DaemonClient(handle.address, handle.secret).ping())["type"] == "pong"
    finally:
        stop.set()
        for watcher in watchers:
            watcher.join()
        with ThreadPoolExecutor(max_workers=12) as pool:
            list(pool.map(local_runtime.destroy, ids))
    assert canary_errors == []
    # Nothing leaked either: every pipe, socket and namespace descriptor of the creates is closed.
    assert _open_fds() - baseline == set()


def test_destroy_kills_strays_under_the_sandbox_uid(local_runtime: LocalRuntime) -> None:
    """A process of the sandbox's host uid outside its namespaces (an interrupted launch) dies too."""
    if os.geteuid() != 0:
        pytest.skip("per-sandbox host uids need a root service")
    handle = local_runtime.create(new_sandbox_id("s"))
    uid = _state(local_runtime, handle.sandbox_id)["hostUid"]
    stray = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "sleep", "300"],
        start_new_session=True,
    )
    try:
        time.sleep(0.1)
        local_runtime.destroy(handle.sandbox_id)
        assert stray.wait(timeout=5) == -9
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_a_sandbox_being_created_is_reported_as_starting(local_runtime: LocalRuntime) -> None:
    sandbox_id = new_sandbox_id("c")
    directory = local_runtime.root / sandbox_id
    directory.mkdir()
    try:
        local_runtime._write_state(
            directory,
            {
                "sandboxId": sandbox_id,
                "creatorPid": os.getpid(),
                "creatorStart": _proc_start_time(os.getpid()),
                "createdAt": time.time(),
                "cgroups": [],
            },
        )
        info = local_runtime.inspect(sandbox_id)
        assert info is not None and info.state == SandboxState.STARTING
    finally:
        local_runtime.destroy(sandbox_id)
    assert not directory.exists()
