"""Local runtime: each sandbox is a bubblewrap container on this host.

Layout of one sandbox's state directory (``<root>/<sandbox id>/``, root-owned, mode 0711 so the
sandbox's host uid can reach the pieces bubblewrap mounts but cannot list them)::

    state.json   what list()/inspect()/destroy() need after a restart of the service (mode 0600)
    d.sock       the daemon's listening socket, bound here and handed in as a descriptor, so no path
                 to it exists inside the sandbox
    daemon.log   stderr of bubblewrap and the daemon
    home/ tmp/   /home/ubuntu and /tmp inside (owned by the sandbox's host uid, 0700)
    etc/         generated passwd, group, hosts, hostname (read-only inside)
    net/         pasta's pid file (owned by the sandbox's host uid, not mounted inside)

Process tree (no process of it is a child of the service, so the service can restart freely)::

    setsid -f  ->  setpriv (drop to the sandbox host uid)  ->  bwrap  ->  init (pid 1)  ->  sandboxd
    pasta (daemonized, same host uid) connecting the sandbox netns to the host's network

When the service runs as root, every sandbox gets its own unprivileged host uid from a configurable
range, so sandboxes cannot touch each other's files even through a shared mount, and nothing inside
ever holds host privileges. Killing the namespace's init kills every process in the sandbox.
"""

from __future__ import annotations

import builtins
import compileall
import contextlib
import fcntl
import json
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import sandboxd
from sandboxes.runtimes.base import (
    DaemonAddress,
    LimitReport,
    NetworkReport,
    RuntimeCapabilities,
    RuntimeUnavailable,
    SandboxCreateError,
    SandboxHandle,
    SandboxInfo,
    SandboxState,
    validate_sandbox_id,
)

SANDBOX_UID = 1000
SANDBOX_USER = "ubuntu"
SANDBOX_HOME = "/home/ubuntu"
TOOLS_MOUNT = "/opt/svc/bin"
LIB_MOUNT = "/opt/svc/lib"
GIB = 1024**3
NS_GET_USERNS = 0xB701
UNIX_PATH_MAX = 107

# /etc entries shared read-only with every sandbox: what programs need to resolve names, verify TLS,
# find libraries and alternatives, and feel like a normal Debian/Ubuntu shell. Secrets such as shadow
# or the host's SSH keys are never on this list.
ETC_SHARED = (
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "profile",
    "profile.d",
    "bash.bashrc",
    "bash_completion",
    "bash_completion.d",
    "inputrc",
    "skel",
    "environment",
    "os-release",
    "lsb-release",
    "debian_version",
    "issue",
    "terminfo",
    "mime.types",
    "magic",
    "python3",
    "python3.11",
    "python3.12",
    "gitconfig",
    "vim",
    "nanorc",
    "ssh/ssh_config",
    "ssh/ssh_config.d",
    "ssh/moduli",
    "protocols",
    "services",
    "networks",
    "login.defs",
    "mailcap",
    "papersize",
    "xdg",
    "npmrc",
    "pip.conf",
    "wgetrc",
    "subversion",
    "fonts",
    "java-17-openjdk",
    "default",
    "pam.d",
    "security",
    "locale.alias",
    "locale.gen",
)


@dataclass(frozen=True)
class LocalRuntimeConfig:
    root: Path
    bwrap: str = "bwrap"
    python: str = "/usr/bin/python3"
    # "auto" picks pasta, then slirp4netns, then no network at all (fail closed); "host" shares the
    # host's network namespace, including its loopback services, and must be chosen explicitly.
    network: str = "auto"
    # The service's own HTTP port: the one host loopback port a sandbox may reach (127.0.0.1:<port>).
    service_port: int | None = None
    # Read-only at /opt/svc/bin inside and first on PATH (the `svc` CLI lives here).
    tools_dir: Path | None = None
    host_uid_base: int = 2_000_000
    host_uid_count: int = 65_536
    # Host-wide record of which sandbox holds which host uid, shared by every runtime root on the
    # machine (test runs, several services) so no two sandboxes ever share a uid. /run is cleared
    # at boot, exactly when every sandbox process is gone too.
    uid_registry: Path = Path("/run/svc-sandboxes/uids")
    cpus: float = 1.0
    memory_bytes: int = GIB
    pids_max: int = 1024
    # Absolute: below the root of each hierarchy, like other container runtimes, so nothing is
    # created inside the cgroup of whatever started the service (a supervisor may need to remove
    # that one). Relative: below the service's own cgroup, for a delegated cgroup v2 subtree.
    cgroup_parent: str = "/svc-sandboxes"
    start_timeout: float = 10.0
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _PendingNetwork:
    process: subprocess.Popen[bytes]
    ready_fd: int  # slirp4netns's ready pipe; -1 for pasta, whose first process exits when ready


@dataclass(frozen=True)
class _CgroupPlan:
    version: int  # 0 = none usable
    # controller -> directory that will hold one sub-directory per sandbox
    parents: dict[str, Path]
    reports: tuple[LimitReport, ...]


def _proc_start_time(pid: int) -> int | None:
    """Start time in clock ticks: together with the pid it identifies a process across pid reuse."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    return int(fields[19])


def _alive(pid: int | None, start_time: int | None) -> bool:
    if not pid:
        return False
    current = _proc_start_time(pid)
    if current is None:
        return False
    if start_time is not None and current != start_time:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cgroup_mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount (if it has controllers) and the v1 mount of each controller."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fs_type, _, options = right.split()[:3]
            mount_point = Path(left.split()[4])
            if fs_type == "cgroup2":
                controllers = mount_point / "cgroup.controllers"
                if controllers.exists() and controllers.read_text().split():
                    v2 = mount_point
            elif fs_type == "cgroup":
                for option in options.split(","):
                    if option in ("cpu", "memory", "pids"):
                        v1[option] = mount_point
    return v2, v1


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for the unified hierarchy) -> this process's cgroup path."""
    result: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                result[controller] = path
    return result


class LocalRuntime:
    """Bubblewrap sandboxes on this host. Thread-safe: creations in parallel are fine."""

    name = "local"

    def __init__(self, config: LocalRuntimeConfig) -> None:
        self.config = config
        self.root = Path(config.root)
        self._capabilities: RuntimeCapabilities | None = None
        self._cgroups: _CgroupPlan | None = None
        self._is_root = os.geteuid() == 0
        # Probing runs external programs and writes cgroup controls: once per instance, even when
        # the first creates arrive together.
        self._probe_lock = threading.Lock()
        self._precompile_daemon()

    def _precompile_daemon(self) -> None:
        # The daemon's directory is read-only inside, so it cannot cache its own bytecode; compiling
        # here saves every sandbox start the compile time. Best effort: a read-only install simply
        # starts a little slower.
        with contextlib.suppress(OSError):
            compileall.compile_dir(str(self._daemon_dir()), quiet=2, force=False)

    # --- host probing ---------------------------------------------------------------------------

    def capabilities(self) -> RuntimeCapabilities:
        if self._capabilities is None:
            with self._probe_lock:
                if self._capabilities is None:
                    self._capabilities = self._probe()
        return self._capabilities

    def _probe(self) -> RuntimeCapabilities:
        problems: builtins.list[str] = []
        bwrap = shutil.which(self.config.bwrap)
        if bwrap is None:
            problems.append(f"bubblewrap ({self.config.bwrap}) is not installed")
        if not os.path.exists(self.config.python):
            problems.append(f"{self.config.python} (runs the sandbox daemon) is missing")
        self._ensure_root_dir(problems)
        if bwrap is not None and not problems:
            probe = subprocess.run(
                [*self._drop_privileges(self.config.host_uid_base), bwrap, *self._base_namespace_args(True),
                 "--ro-bind", "/usr", "/usr", *self._merged_usr_args(), "--", "/bin/true"],
                capture_output=True, env=self._launcher_env(), timeout=30, check=False,
            )  # fmt: skip
            if probe.returncode != 0:
                problems.append(
                    "bubblewrap cannot create user namespaces here: " + probe.stderr.decode(errors="replace").strip()
                )

        plan = self._cgroup_plan()
        user = LimitReport(
            name="user",
            enforced=self._is_root,
            value=f"uid {SANDBOX_UID} inside, unprivileged host uid",
            mechanism=(
                f"one host uid per sandbox from {self.config.host_uid_base} via setpriv + user namespace"
                if self._is_root
                else "user namespace"
            ),
            detail="" if self._is_root else "the service is not root: sandboxes run under the service's own uid",
        )
        network = self._network_plan()
        network_limit = LimitReport(
            name="network",
            enforced=network.host_loopback_blocked,
            value="outbound only, host loopback unreachable",
            mechanism=network.mode,
            detail=network.detail,
        )
        return RuntimeCapabilities(
            runtime=self.name,
            available=not problems,
            limits=(*plan.reports, user, network_limit),
            network=network,
            problems=tuple(problems),
        )

    def _ensure_root_dir(self, problems: builtins.list[str]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # Traversable but not listable: each sandbox's host uid must reach its own pieces.
            os.chmod(self.root, 0o711)  # noqa: S103
        except OSError as exc:
            problems.append(f"cannot prepare sandbox root {self.root}: {exc}")
            return
        if self._is_root:
            # bubblewrap runs as the sandbox's host uid and must be able to walk to the mounted pieces.
            for path in [self.root.resolve(), *self.root.resolve().parents, *self._daemon_dir().parents]:
                mode = path.stat().st_mode
                if not mode & stat.S_IXOTH:
                    problems.append(f"{path} is not traversable by other users (mode {oct(mode & 0o777)})")

    def _network_plan(self) -> NetworkReport:
        wanted = self.config.network
        ports = (self.config.service_port,) if self.config.service_port else ()
        if wanted == "host":
            return NetworkReport(
                mode="host",
                outbound=True,
                host_loopback_blocked=False,
                forwarded_host_ports=ports,
                detail="host networking chosen by configuration: every host loopback service is reachable",
            )
        if wanted == "none":
            return NetworkReport(mode="none", outbound=False, host_loopback_blocked=True, detail="network disabled")
        if wanted in ("auto", "pasta") and shutil.which("pasta"):
            return NetworkReport(mode="pasta", outbound=True, host_loopback_blocked=True, forwarded_host_ports=ports)
        if wanted in ("auto", "slirp4netns") and shutil.which("slirp4netns"):
            return NetworkReport(
                mode="slirp4netns",
                outbound=True,
                host_loopback_blocked=True,
                detail="slirp4netns cannot forward the service port into the sandbox" if ports else "",
            )
        return NetworkReport(
            mode="none",
            outbound=False,
            host_loopback_blocked=True,
            detail=f"network mode {wanted!r} unavailable (install passt or slirp4netns): sandboxes have no network",
        )

    def _cgroup_plan(self) -> _CgroupPlan:
        # Computed by _probe() under the probe lock; every later caller reads the finished plan.
        if self._cgroups is not None:
            return self._cgroups
        cfg = self.config
        targets = {
            "cpu": f"{cfg.cpus:g} CPU",
            "memory": f"{cfg.memory_bytes / GIB:g} GiB",
            "pids": f"{cfg.pids_max} processes",
        }
        v2, v1 = _cgroup_mounts()
        own = _own_cgroups()
        parents: dict[str, Path] = {}
        reports: builtins.list[LimitReport] = []
        version = 0

        def parent_for(mount: Path, own_path: str) -> Path:
            if cfg.cgroup_parent.startswith("/"):
                return mount / cfg.cgroup_parent.lstrip("/")
            return mount / own_path.lstrip("/") / cfg.cgroup_parent

        if v1:
            version = 1
            for controller in ("cpu", "memory", "pids"):
                mount = v1.get(controller)
                if mount is None:
                    reports.append(LimitReport(controller, False, targets[controller], detail="controller not mounted"))
                    continue
                parent = parent_for(mount, own.get(controller, "/"))
                error = self._probe_cgroup_dir(parent)
                if error:
                    reports.append(LimitReport(controller, False, targets[controller], "cgroup v1", error))
                else:
                    parents[controller] = parent
                    reports.append(LimitReport(controller, True, targets[controller], f"cgroup v1 {controller}"))
        elif v2 is not None:
            version = 2
            parent = parent_for(v2, own.get("", "/"))
            error = self._probe_cgroup_dir(parent)
            available = set()
            if not error:
                try:
                    with open(parent / "cgroup.subtree_control", "w") as f:
                        f.write("+cpu +memory +pids")
                except OSError as exc:
                    error = f"cannot enable controllers in {parent}: {exc}"
                available = set((parent / "cgroup.subtree_control").read_text().split()) if not error else set()
            for controller in ("cpu", "memory", "pids"):
                if controller in available:
                    parents[controller] = parent
                    reports.append(LimitReport(controller, True, targets[controller], f"cgroup v2 {controller}"))
                else:
                    reports.append(
                        LimitReport(controller, False, targets[controller], "cgroup v2", error or "controller missing")
                    )
        else:
            for controller in ("cpu", "memory", "pids"):
                reports.append(LimitReport(controller, False, targets[controller], detail="no cgroup hierarchy found"))
        self._cgroups = _CgroupPlan(version=version, parents=parents, reports=tuple(reports))
        return self._cgroups

    @staticmethod
    def _probe_cgroup_dir(parent: Path) -> str:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            probe = parent / f"probe-{os.getpid()}-{secrets.token_hex(3)}"
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"cannot create cgroups under {parent}: {exc.strerror or exc}"
        return ""

    # --- lifecycle ------------------------------------------------------------------------------

    def create(
        self, sandbox_id: str, *, secret: str | None = None, env: dict[str, str] | None = None, pooled: bool = False
    ) -> SandboxHandle:
        validate_sandbox_id(sandbox_id)
        caps = self.capabilities()
        if not caps.available:
            raise RuntimeUnavailable("; ".join(caps.problems))
        directory = self.root / sandbox_id
        socket_path = directory / "d.sock"
        if len(str(socket_path).encode()) > UNIX_PATH_MAX:
            raise SandboxCreateError(f"sandbox root {self.root} is too long for a unix socket path")
        secret = secret or secrets.token_urlsafe(32)

        with self._lock():
            try:
                directory.mkdir(mode=0o711)
            except FileExistsError:
                raise SandboxCreateError(f"sandbox {sandbox_id} already exists") from None
            host_uid = self._allocate_uid(directory)

        try:
            handle = self._start(sandbox_id, directory, socket_path, host_uid, secret, env or {}, pooled)
            if pooled:
                # Listed for claim() only once it is ready; the state file already says it is pooled.
                self._pool_index().mkdir(mode=0o700, exist_ok=True)
                (self._pool_index() / sandbox_id).touch()
            return handle
        except BaseException as exc:
            self.destroy(sandbox_id)
            if isinstance(exc, SandboxCreateError | RuntimeUnavailable):
                raise
            if isinstance(exc, Exception):
                raise SandboxCreateError(f"could not start sandbox {sandbox_id}: {exc}") from exc
            raise

    def _start(
        self,
        sandbox_id: str,
        directory: Path,
        socket_path: Path,
        host_uid: int,
        secret: str,
        env: dict[str, str],
        pooled: bool,
    ) -> SandboxHandle:
        cfg = self.config
        started = time.time()
        self._prepare_files(sandbox_id, directory, host_uid)
        cgroups, limit_reports = self._make_cgroups(sandbox_id)
        # Written before anything runs so that destroy() can clean up even after a crash from here on.
        state: dict[str, Any] = {
            "sandboxId": sandbox_id,
            "hostUid": host_uid,
            "creatorPid": os.getpid(),
            "creatorStart": _proc_start_time(os.getpid()),
            "cgroups": [str(p) for p in cgroups],
            "createdAt": started,
            "pooled": pooled,
        }
        self._write_state(directory, state)

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = _OwnedFds()
        try:
            listener.bind(str(socket_path))
            os.chmod(socket_path, 0o600)
            listener.listen(128)
            secret_r, secret_w = fds.pipe()
            os.write(secret_w, secret.encode())
            fds.close(secret_w)
            ready_r, ready_w = fds.pipe()
            info_r, info_w = fds.pipe()
            listen_fd = listener.fileno()
            pass_fds = (listen_fd, secret_r, ready_w, info_w)

            network = self.capabilities().network
            daemon_argv = [
                cfg.python, "-E", "-s", "-B", "-m", "sandboxd",
                "--listen-fd", str(listen_fd), "--secret-fd", str(secret_r), "--ready-fd", str(ready_w),
                "--home", SANDBOX_HOME, "--user", SANDBOX_USER,
            ]  # fmt: skip
            for name, value in {**cfg.extra_env, **env}.items():
                daemon_argv += ["--env", f"{name}={value}"]
            bwrap_argv = [
                shutil.which(cfg.bwrap) or cfg.bwrap,
                *self._base_namespace_args(network.mode != "host"),
                "--as-pid-1",
                "--hostname", sandbox_id,
                "--new-session",
                *self._filesystem_args(directory),
                "--info-fd", str(info_w),
                "--chdir", LIB_MOUNT,
                "--", *daemon_argv,
            ]  # fmt: skip
            # setsid -f detaches the sandbox from the service's process tree (it must outlive a restart
            # of the service, and must never become the service's zombie); setpriv drops to the
            # sandbox's host uid before bubblewrap runs.
            launcher = ["setsid", "-f", *self._drop_privileges(host_uid), *bwrap_argv]
            with open(directory / "daemon.log", "ab") as log:
                launched = subprocess.run(
                    launcher, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=self._launcher_env(), timeout=cfg.start_timeout, check=False,
                )  # fmt: skip
            # Only the sandbox may hold the write ends now, so their end-of-file means it died.
            fds.close(info_w)
            fds.close(ready_w)
            if launched.returncode != 0:
                raise SandboxCreateError(f"launcher failed ({launched.returncode}): {self._log_tail(directory)}")

            info = self._read_info(info_r, cfg.start_timeout)
            if info is None:
                raise SandboxCreateError(f"bubblewrap did not start: {self._log_tail(directory)}")
            init_pid = int(info["child-pid"])
            state.update(initPid=init_pid, initStart=_proc_start_time(init_pid))
            self._write_state(directory, state)

            # The network helper, the cgroup attach (slow on cgroup v1: it waits for an RCU grace
            # period) and the daemon's own start-up all run at the same time. Nothing inside can
            # start a process before the daemon accepts a request, and that only happens after this
            # method returns, so attaching the daemon alone puts every sandbox process in the cgroups.
            # bubblewrap is still configuring the namespaces (its own netlink talk to bring up the
            # loopback, mounts) until it execs the daemon; touching the network namespace or moving
            # the process before that races with it.
            if not self._wait_exec(init_pid, cfg.start_timeout):
                raise SandboxCreateError(f"bubblewrap did not start the daemon: {self._log_tail(directory)}")
            pending_network = self._start_network(directory, init_pid, host_uid, network, state)
            self._attach(init_pid, cgroups)
            network = self._finish_network(pending_network, network, state)
            self._write_state(directory, state)

            remaining = max(0.1, cfg.start_timeout - (time.time() - started))
            if not self._wait_ready(ready_r, remaining):
                raise SandboxCreateError(f"sandbox daemon did not become ready: {self._log_tail(directory)}")
        finally:
            listener.close()
            fds.close_all()

        state.update(
            secret=secret,
            socket=str(socket_path),
            limits=[r.as_dict() for r in limit_reports],
            network=network.as_dict(),
        )
        self._write_state(directory, state)
        return self._handle_from_state(state)

    # --- warm pool ------------------------------------------------------------------------------
    #
    # A pool member is an ordinary sandbox whose state says "pooled": it belongs to nobody yet.
    # <root>/.pool/<id> lists the ready ones so a claim reads a handful of entries, not every
    # sandbox's state. Claims hold the root's flock (host-wide, every process sharing this root)
    # while they flip the state file from pooled to claimed, so one member is never handed out twice
    # and a reader of the state file sees either "pooled" or "claimed at", never neither.

    def _pool_index(self) -> Path:
        return self.root / ".pool"

    def claim(self, sandbox_id: str | None = None) -> SandboxHandle | None:
        if sandbox_id is not None:
            validate_sandbox_id(sandbox_id)
        with self._lock():
            try:
                candidates = [sandbox_id] if sandbox_id else sorted(os.listdir(self._pool_index()))
            except FileNotFoundError:
                return None
            for candidate in candidates:
                directory = self.root / candidate
                state = self._read_state(directory)
                if (
                    state is not None
                    and state.get("pooled")
                    and "secret" in state
                    and _alive(state.get("initPid"), state.get("initStart"))
                ):
                    state.update(pooled=False, claimedAt=time.time())
                    self._write_state(directory, state)
                    with contextlib.suppress(FileNotFoundError):
                        (self._pool_index() / candidate).unlink()
                    return self._handle_from_state(state)
                if state is None or not state.get("pooled"):
                    # Claimed or destroyed already: the index entry is left over.
                    with contextlib.suppress(FileNotFoundError):
                        (self._pool_index() / candidate).unlink()
        return None

    def pool_ready(self) -> builtins.list[str]:
        """Ids of the pool members ready to be claimed."""
        try:
            names = sorted(os.listdir(self._pool_index()))
        except FileNotFoundError:
            return []
        ready = []
        for name in names:
            state = self._read_state(self.root / name)
            if state and state.get("pooled") and _alive(state.get("initPid"), state.get("initStart")):
                ready.append(name)
        return ready

    def fill_pool(self, size: int, make_id: Callable[[], str], *, stop: Callable[[], bool] = lambda: False) -> int:
        started = 0
        # Fillers of every process take turns, so together they never overshoot; claims and
        # ordinary creates take the root's lock, not this one, and are never held up by a fill.
        with self._lock(".pool.lock"):
            while not stop() and len(self.pool_ready()) < size:
                self.create(make_id(), pooled=True)
                started += 1
        return started

    def drain_pool(self) -> builtins.list[str]:
        drained = []
        while (handle := self.claim()) is not None:
            self.destroy(handle.sandbox_id)
            drained.append(handle.sandbox_id)
        return drained

    # --- teardown -------------------------------------------------------------------------------

    def destroy(self, sandbox_id: str) -> bool:
        validate_sandbox_id(sandbox_id)
        directory = self.root / sandbox_id
        with contextlib.suppress(FileNotFoundError):
            (self._pool_index() / sandbox_id).unlink()
        if not directory.exists():
            return False
        state = self._read_state(directory) or {}
        init_pid = state.get("initPid")
        if init_pid and _alive(init_pid, state.get("initStart")):
            # SIGKILL to a pid namespace's init takes every process in the namespace with it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(init_pid, signal.SIGKILL)
        for cgroup in state.get("cgroups", []):
            self._kill_cgroup(Path(cgroup))
        self._stop_helper(directory / "net" / "pasta.pid", ("pasta", "passt"))
        slirp_pid = state.get("slirpPid")
        if slirp_pid and _alive(slirp_pid, state.get("slirpStart")) and _comm(slirp_pid) == "slirp4netns":
            with contextlib.suppress(ProcessLookupError):
                os.kill(slirp_pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(slirp_pid, 0)
        deadline = time.monotonic() + 5
        while init_pid and _alive(init_pid, state.get("initStart")) and time.monotonic() < deadline:
            time.sleep(0.005)
        host_uid = state.get("hostUid")
        if self._is_root and isinstance(host_uid, int) and self._owns_uid(host_uid, directory):
            # The host uid belongs to this sandbox alone, so whatever still runs under it is a piece
            # of this sandbox that the steps above missed (for example a launch interrupted before
            # its pid was recorded).
            _kill_uid(host_uid)
        for cgroup in state.get("cgroups", []):
            self._remove_cgroup(Path(cgroup))
        shutil.rmtree(directory, onerror=_force_remove)
        if self._is_root and isinstance(host_uid, int):
            self._release_uid(host_uid, directory)
        return True

    def inspect(self, sandbox_id: str) -> SandboxInfo | None:
        validate_sandbox_id(sandbox_id)
        directory = self.root / sandbox_id
        if not directory.is_dir():
            return None
        return self._info(sandbox_id, directory)

    def list(self) -> builtins.list[SandboxInfo]:
        if not self.root.is_dir():
            return []
        result = []
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                result.append(self._info(entry.name, entry))
        return result

    def _info(self, sandbox_id: str, directory: Path) -> SandboxInfo:
        state = self._read_state(directory)
        if state is None or "secret" not in state:
            if state is not None and _alive(state.get("creatorPid"), state.get("creatorStart")):
                age = time.time() - float(state.get("createdAt", 0))
                if age < self.config.start_timeout + 5:
                    return SandboxInfo(
                        sandbox_id, SandboxState.STARTING, None, "being created", pooled=bool(state.get("pooled"))
                    )
            pooled = bool(state and state.get("pooled"))
            return SandboxInfo(sandbox_id, SandboxState.EXITED, None, "never finished starting", pooled=pooled)
        handle = self._handle_from_state(state)
        pooled, claimed_at = bool(state.get("pooled")), state.get("claimedAt")
        if _alive(state.get("initPid"), state.get("initStart")):
            return SandboxInfo(sandbox_id, SandboxState.RUNNING, handle, pooled=pooled, claimed_at=claimed_at)
        return SandboxInfo(
            sandbox_id, SandboxState.EXITED, handle, "its processes are gone", pooled=pooled, claimed_at=claimed_at
        )

    # --- pieces ---------------------------------------------------------------------------------

    def _drop_privileges(self, host_uid: int) -> builtins.list[str]:
        if not self._is_root:
            return []
        return ["setpriv", f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]

    @staticmethod
    def _launcher_env() -> dict[str, str]:
        # Nothing of the service's environment (database URLs, keys) may leak into a sandbox.
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

    @staticmethod
    def _base_namespace_args(unshare_net: bool) -> builtins.list[str]:
        args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if unshare_net:
            args.append("--unshare-net")
        return [*args, "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]

    @staticmethod
    def _merged_usr_args() -> builtins.list[str]:
        args: builtins.list[str] = []
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        return args

    def _daemon_dir(self) -> Path:
        return Path(sandboxd.__file__).resolve().parent

    def _filesystem_args(self, directory: Path) -> builtins.list[str]:
        args = [
            "--ro-bind", "/usr", "/usr",
            *self._merged_usr_args(),
            "--proc", "/proc",
            "--dev", "/dev",
            "--dir", "/etc",
        ]  # fmt: skip
        for name in ETC_SHARED:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name in ("passwd", "group", "hosts", "hostname"):
            args += ["--ro-bind", str(directory / "etc" / name), f"/etc/{name}"]
        args += [
            "--bind", str(directory / "home"), SANDBOX_HOME,
            "--bind", str(directory / "tmp"), "/tmp",  # noqa: S108 - a mount point inside the sandbox
            "--dir", "/var",
            "--symlink", "../tmp", "/var/tmp",  # noqa: S108
            "--tmpfs", "/run",
            "--dir", "/opt/svc",
            "--ro-bind", str(self._daemon_dir()), f"{LIB_MOUNT}/sandboxd",
        ]  # fmt: skip
        if self.config.tools_dir is not None and Path(self.config.tools_dir).is_dir():
            args += ["--ro-bind", str(Path(self.config.tools_dir).resolve()), TOOLS_MOUNT]
        else:
            args += ["--dir", TOOLS_MOUNT]
        return args

    def _prepare_files(self, sandbox_id: str, directory: Path, host_uid: int) -> None:
        owner = host_uid if self._is_root else os.getuid()
        for name in ("home", "tmp", "net"):
            path = directory / name
            path.mkdir(mode=0o700)
            os.chown(path, owner, owner)
        skel = Path("/etc/skel")
        if skel.is_dir():
            for entry in skel.iterdir():
                if entry.is_file() and not entry.is_symlink():
                    target = directory / "home" / entry.name
                    shutil.copyfile(entry, target)
                    os.chown(target, owner, owner)
        etc = directory / "etc"
        etc.mkdir(mode=0o755)
        files = {
            "passwd": (
                "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{SANDBOX_HOME}:/bin/bash\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            "group": f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
            "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{sandbox_id}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "hostname": f"{sandbox_id}\n",
        }
        for name, content in files.items():
            path = etc / name
            path.write_text(content)
            os.chmod(path, 0o644)

    def _make_cgroups(self, sandbox_id: str) -> tuple[builtins.list[Path], builtins.list[LimitReport]]:
        plan = self._cgroup_plan()
        cfg = self.config
        created: builtins.list[Path] = []
        reports: builtins.list[LimitReport] = []
        by_dir: dict[Path, builtins.list[str]] = {}
        for controller, parent in plan.parents.items():
            by_dir.setdefault(parent / sandbox_id, []).append(controller)
        for path in by_dir:
            path.mkdir(exist_ok=True)
            created.append(path)
        settings: dict[str, builtins.list[tuple[str, str]]] = {}
        if plan.version == 1:
            period = 100_000
            settings = {
                "cpu": [("cpu.cfs_period_us", str(period)), ("cpu.cfs_quota_us", str(int(cfg.cpus * period)))],
                "memory": [
                    ("memory.limit_in_bytes", str(cfg.memory_bytes)),
                    ("memory.memsw.limit_in_bytes", str(cfg.memory_bytes)),
                ],
                "pids": [("pids.max", str(cfg.pids_max))],
            }
        elif plan.version == 2:
            period = 100_000
            settings = {
                "cpu": [("cpu.max", f"{int(cfg.cpus * period)} {period}")],
                "memory": [("memory.max", str(cfg.memory_bytes)), ("memory.swap.max", "0")],
                "pids": [("pids.max", str(cfg.pids_max))],
            }
        for base in plan.reports:
            if not base.enforced or base.name not in plan.parents:
                reports.append(base)
                continue
            path = plan.parents[base.name] / sandbox_id
            errors = []
            for filename, value in settings.get(base.name, []):
                target = path / filename
                if not target.exists() and filename.startswith(("memory.memsw", "memory.swap")):
                    continue  # no swap accounting: there is no swap to limit
                try:
                    target.write_text(value)
                except OSError as exc:
                    errors.append(f"{filename}: {exc.strerror or exc}")
            if errors:
                reports.append(replace(base, enforced=False, detail="; ".join(errors)))
            else:
                reports.append(base)
        return created, reports

    def _start_network(
        self, directory: Path, init_pid: int, host_uid: int, network: NetworkReport, state: dict[str, Any]
    ) -> _PendingNetwork | None:
        if network.mode not in ("pasta", "slirp4netns"):
            return None
        fds = _OwnedFds()
        try:
            netns = fds.add(os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
            # bubblewrap nests a second user namespace inside the one that owns the network namespace;
            # the helper must join the owner, which only the netns itself can tell us. (The kernel
            # returns it close-on-exec.)
            userns = fds.add(fcntl.ioctl(netns, NS_GET_USERNS))
            if network.mode == "pasta":
                port_spec = ",".join(str(p) for p in network.forwarded_host_ports) or "none"
                argv = [
                    *self._drop_privileges(host_uid), "pasta", "--config-net", "--quiet",
                    "--no-map-gw", "-t", "none", "-u", "none", "-U", "none", "-T", port_spec,
                    "--userns", f"/proc/self/fd/{userns}", "--netns", f"/proc/self/fd/{netns}",
                    "--pid", str(directory / "net" / "pasta.pid"),
                ]  # fmt: skip
                # pasta daemonizes once the namespace is configured; its first process exiting is
                # the signal that the network is up.
                proc = subprocess.Popen(
                    argv, pass_fds=(netns, userns), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, env=self._launcher_env(),
                )  # fmt: skip
                return _PendingNetwork(proc, -1)
            ready_r, ready_w = fds.pipe()
            argv = [
                *self._drop_privileges(host_uid), "slirp4netns", "--configure", "--mtu=65520",
                "--disable-host-loopback", "--netns-type=path", f"--userns-path=/proc/self/fd/{userns}",
                "--ready-fd", str(ready_w), f"/proc/self/fd/{netns}", "tap0",
            ]  # fmt: skip
            proc = subprocess.Popen(
                argv, pass_fds=(netns, userns, ready_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=self._launcher_env(), start_new_session=True,
            )  # fmt: skip
            fds.close(ready_w)
            state.update(slirpPid=proc.pid, slirpStart=_proc_start_time(proc.pid))
            # _finish_network owns the read end from here on.
            return _PendingNetwork(proc, fds.release(ready_r))
        finally:
            fds.close_all()

    def _finish_network(
        self, pending: _PendingNetwork | None, network: NetworkReport, state: dict[str, Any]
    ) -> NetworkReport:
        if pending is None:
            return network
        timeout = self.config.start_timeout
        if pending.ready_fd < 0:
            try:
                _, stderr = pending.process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pending.process.kill()
                _, stderr = pending.process.communicate()
            if pending.process.returncode == 0:
                return network
            message = " ".join(
                line for line in stderr.decode(errors="replace").splitlines() if "syslog" not in line
            ).strip()
            detail = f"pasta failed ({message or pending.process.returncode}): this sandbox has no network"
        else:
            try:
                if self._wait_ready(pending.ready_fd, timeout):
                    return network
            finally:
                os.close(pending.ready_fd)
            detail = "slirp4netns failed: this sandbox has no network"
        return replace(network, mode="none", outbound=False, forwarded_host_ports=(), detail=detail)

    def _attach(self, pid: int, cgroups: builtins.list[Path]) -> None:
        for cgroup in cgroups:
            try:
                (cgroup / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                raise SandboxCreateError(f"cannot move the sandbox into {cgroup}: {exc.strerror or exc}") from exc
        if self._is_root:
            # A little protection for the daemon: the OOM killer should pick the command that ate
            # the memory, not the process that keeps the sandbox reachable. The daemon resets it to
            # 0 for everything it starts.
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/oom_score_adj").write_text("-500")

    @staticmethod
    def _read_info(fd: int, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        buffer = b""
        while time.monotonic() < deadline:
            if not _readable(fd, deadline - time.monotonic()):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buffer += chunk
            with contextlib.suppress(ValueError):
                value: dict[str, Any] = json.loads(buffer)
                return value
            # bubblewrap may keep the descriptor open after writing one complete JSON object.
            end = buffer.find(b"\n}")
            if end >= 0:
                with contextlib.suppress(ValueError):
                    value = json.loads(buffer[: end + 2])
                    return value
        return None

    @staticmethod
    def _wait_exec(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            comm = _comm(pid)
            if not comm:
                return False
            if comm != "bwrap":
                return True
            time.sleep(0.0005)
        return False

    @staticmethod
    def _wait_ready(fd: int, timeout: float) -> bool:
        return _readable(fd, timeout) and os.read(fd, 1) == b"1"

    @staticmethod
    def _log_tail(directory: Path) -> str:
        try:
            data = (directory / "daemon.log").read_bytes()[-2000:]
        except OSError:
            return "(no log)"
        return data.decode(errors="replace").strip() or "(empty log)"

    @staticmethod
    def _kill_cgroup(path: Path) -> None:
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    @staticmethod
    def _remove_cgroup(path: Path) -> None:
        for _ in range(200):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                LocalRuntime._kill_cgroup(path)
                time.sleep(0.01)

    @staticmethod
    def _stop_helper(pid_file: Path, names: tuple[str, ...]) -> None:
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if _comm(pid).startswith(names):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _owns_uid(self, uid: int, directory: Path) -> bool:
        """True if the registry says ``uid`` belongs to the sandbox in ``directory``."""
        base = self.config.host_uid_base
        if uid in (0, os.getuid()) or not base <= uid < base + self.config.host_uid_count:
            return False
        try:
            return (self.config.uid_registry / str(uid)).read_text() == str(directory.resolve())
        except OSError:
            return False

    def _release_uid(self, uid: int, directory: Path) -> None:
        with self._registry_lock():
            if self._owns_uid(uid, directory):
                with contextlib.suppress(OSError):
                    (self.config.uid_registry / str(uid)).unlink()

    @contextlib.contextmanager
    def _lock(self, name: str = ".lock") -> Iterator[None]:
        # flock belongs to the open file description: it excludes other threads of this process
        # (each call opens the file anew) as well as other processes.
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / name, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _registry_lock(self) -> Iterator[None]:
        registry = self.config.uid_registry
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(registry / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _allocate_uid(self, directory: Path) -> int:
        if not self._is_root:
            return os.getuid()
        owner = str(directory.resolve())
        with self._registry_lock():
            for offset in range(self.config.host_uid_count):
                uid = self.config.host_uid_base + offset
                entry = self.config.uid_registry / str(uid)
                try:
                    holder = entry.read_text()
                except FileNotFoundError:
                    holder = ""
                # A holder whose sandbox directory is gone was destroyed without releasing (a crash).
                if holder and Path(holder).is_dir():
                    continue
                entry.write_text(owner)
                return uid
        raise SandboxCreateError("no free host uid for another sandbox")

    @staticmethod
    def _write_state(directory: Path, state: dict[str, Any]) -> None:
        # A temporary name of its own per writer: two writers (another thread, another process)
        # sharing one would rename each other's half-written file into place.
        tmp = directory / f".state.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        os.replace(tmp, directory / "state.json")

    @staticmethod
    def _read_state(directory: Path) -> dict[str, Any] | None:
        try:
            value = json.loads((directory / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _handle_from_state(self, state: dict[str, Any]) -> SandboxHandle:
        network = state.get("network")
        return SandboxHandle(
            sandbox_id=state["sandboxId"],
            runtime=self.name,
            address=DaemonAddress(unix_path=state["socket"]),
            secret=state["secret"],
            created_at=state["createdAt"],
            limits=tuple(LimitReport(**item) for item in state.get("limits", [])),
            network=(
                NetworkReport(**{**network, "forwarded_host_ports": tuple(network.get("forwarded_host_ports", ()))})
                if network
                else None
            ),
        )


class _OwnedFds:
    """The descriptors one create step opened, each closed exactly once.

    A descriptor number is reused by the next open() of any thread the moment it is closed; closing
    it a second time closes whatever another thread opened in between (a database file, another
    sandbox's pipe). Every raw descriptor therefore lives here until it is closed through here or
    handed on with release(). Confined to the thread that made it.
    """

    def __init__(self) -> None:
        self._open: set[int] = set()

    def add(self, fd: int) -> int:
        self._open.add(fd)
        return fd

    def pipe(self) -> tuple[int, int]:
        # os.pipe() descriptors are close-on-exec: a child of any thread gets one only through its
        # own pass_fds, never by accident, so a concurrent spawn cannot keep a pipe from reaching EOF.
        read_end, write_end = os.pipe()
        self._open.update((read_end, write_end))
        return read_end, write_end

    def release(self, fd: int) -> int:
        self._open.remove(fd)
        return fd

    def close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)

    def close_all(self) -> None:
        while self._open:
            with contextlib.suppress(OSError):
                os.close(self._open.pop())


def _readable(fd: int, timeout: float) -> bool:
    # poll, not select: a busy server has descriptors above select's FD_SETSIZE of 1024.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is ``uid``, until none is left."""
    for _ in range(50):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                status = Path(entry.path, "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("Uid", "-1 ").split()[0]) != uid or fields.get("State", "").strip().startswith("Z"):
                continue
            found = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


def _force_remove(function: Any, path: str, _exc_info: Any) -> None:
    """rmtree fallback: the sandbox may have left directories without write permission."""
    with contextlib.suppress(OSError):
        parent = os.path.dirname(path)
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
