"""The sandbox daemon: serves exec, files, process streams and credentials to the control plane.

It runs inside the sandbox as the sandbox user and is normally PID 1 of the sandbox's pid namespace
(bubblewrap ``--as-pid-1``, or the container entrypoint on Kubernetes). One thread per connection with
plain blocking I/O keeps start-up fast (no asyncio import: the daemon's start is on the critical path
of creating a sandbox) and moves bulk data with a couple of syscalls per 1 MiB chunk.

Child processes: one SIGCHLD handler on the main thread reaps every exited child with
``waitpid(-1)``, which also collects orphans re-parented to PID 1, and hands our own children's
statuses to the threads waiting for them. Each command runs in its own session and process group so a
timeout or a disconnected client kills everything it started, while a background process the command
left behind on purpose survives a normal exit.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hmac
import io
import json
import os
import re
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Mapping

from sandboxd.protocol import (
    CHUNK_SIZE,
    HEADER,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    TIMEOUT_EXIT_CODE,
    ErrorCode,
    Kind,
    ProtocolError,
    decode_json,
    encode_json,
    parse_header,
)
from sandboxd.workers import Workers

# typing costs start-up time inside every sandbox and only the type checker needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def log(message: str) -> None:
    # stderr goes to the sandbox's daemon.log on the host; the logging module is not worth its
    # import time here.
    sys.stderr.write(f"sandboxd: {message}\n")
    sys.stderr.flush()


DEFAULT_PATH = "/opt/svc/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Above this a command no longer fits one argv string (Linux caps a single argument at 128 KiB), so it
# is handed to bash through a memfd instead.
ARGV_COMMAND_LIMIT = 100_000

# How long output from an exited command's pipes is still collected when a background process it
# started keeps them open; after that the exec is reported done and the pipes are drained silently.
LINGER_SECONDS = 0.2
# At most this long between a command's start and the client hearing of it (see _supervise).
STARTED_DELAY_SECONDS = 0.005

AUTH_TIMEOUT_SECONDS = 10.0
# Operations after which a connection may carry the client's next request: each ends with a final
# message and leaves nothing unread. The control plane keeps such a connection for its next command,
# which then costs no connect, accept and hand-over to a worker thread.
REUSABLE_OPS = frozenset({"exec", "ping"})
# How long a kept connection may wait for that next request (the control plane gives up on it sooner).
IDLE_CONNECTION_SECONDS = 60.0
# An exec or process started while the sandbox fetches its credentials waits for them (so it sees
# SVC_API_KEY), but no longer than this after the fetch began: a control plane that died half-way
# must not leave every command waiting.
CREDENTIALS_WAIT_SECONDS = 15.0
# The token exchange's own limit, from inside the sandbox.
EXCHANGE_TIMEOUT_SECONDS = 10.0
F_SETPIPE_SZ = 1031
PIPE_SIZE = 1024 * 1024
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RequestError(Exception):
    """Ends a request with an error reply the client can act on."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ClientGone(Exception):  # noqa: N818 - a condition, not a failure
    """The control plane closed the connection; whatever the request started must be stopped."""


class DaemonConfig:
    # A plain class rather than a dataclass: importing dataclasses costs start-up time.
    def __init__(
        self,
        secret: bytes,
        *,
        home: str = "/home/ubuntu",
        user: str = "ubuntu",
        path: str = DEFAULT_PATH,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.secret = secret
        self.home = home
        self.user = user
        self.path = path
        # Variables every exec and process sees in addition to the fixed ones (HOME, USER, PATH...).
        self.base_env = dict(base_env or {})


def _exit_code(wait_status_code: int) -> tuple[int, str | None]:
    """Shell convention: a child killed by signal N reports 128 + N."""
    if wait_status_code < 0:
        signum = -wait_status_code
        try:
            name: str | None = signal.Signals(signum).name
        except ValueError:
            name = None
        return 128 + signum, name
    return wait_status_code, None


def _errno_error(exc: OSError, path: str) -> RequestError:
    if exc.errno == errno.ENOENT:
        return RequestError(ErrorCode.NOT_FOUND, f"{path}: no such file or directory")
    if exc.errno == errno.ENOTDIR:
        return RequestError(ErrorCode.NOT_A_DIRECTORY, f"{path}: a parent is not a directory")
    if exc.errno == errno.EISDIR:
        return RequestError(ErrorCode.IS_DIRECTORY, f"{path}: is a directory")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RequestError(ErrorCode.PERMISSION_DENIED, f"{path}: {os.strerror(exc.errno)}")
    return RequestError(ErrorCode.IO_ERROR, f"{path}: {exc.strerror or exc}")


def _require_absolute(value: Any, what: str = "path") -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(ErrorCode.BAD_REQUEST, f"{what} must be a non-empty string")
    if "\x00" in value:
        raise RequestError(ErrorCode.INVALID_PATH, f"{what} contains a NUL byte")
    if not value.startswith("/"):
        raise RequestError(ErrorCode.INVALID_PATH, f"{what} must be absolute: {value!r}")
    return value


def _env_mapping(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(ErrorCode.BAD_REQUEST, f"{what} must be an object")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise RequestError(ErrorCode.BAD_REQUEST, f"invalid environment variable name {key!r}")
        if not isinstance(item, str) or "\x00" in item:
            raise RequestError(ErrorCode.BAD_REQUEST, f"environment variable {key} must be a string without NUL")
        env[key] = item
    return env


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """True while the group still has members (zombies included)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group_until_gone(pgid: int) -> None:
    """SIGKILL the group until it is empty: a fork bomb keeps adding members while we kill."""
    for _ in range(400):
        if not _kill_group(pgid):
            return
        time.sleep(0.005)


def _set_winsize(fd: int, cols: Any, rows: Any) -> None:
    def clamp(value: Any, default: int) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10000:
            return value
        return default

    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", clamp(rows, 24), clamp(cols, 80), 0, 0))


class Connection:
    """One client connection: buffered frame reads, and frame writes without copying payloads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile: io.BufferedReader = sock.makefile("rb", buffering=CHUNK_SIZE)  # type: ignore[assignment]
        self.send_lock = threading.Lock()
        self.pending = b""

    def read_frame(self) -> tuple[int, bytes] | None:
        header = self._header()
        if header is None:
            return None
        kind, length = header
        payload = self.rfile.read(length) if length else b""
        if len(payload) < length:
            raise ProtocolError("connection closed inside a frame")
        return kind, payload

    def read_frame_into(self, buffer: bytearray) -> tuple[int, memoryview] | None:
        """Like read_frame, with the payload read straight into ``buffer`` (grown when needed), and
        valid until the next call: a stream of large data frames is then copied once, not twice."""
        header = self._header()
        if header is None:
            return None
        kind, length = header
        if length > len(buffer):
            buffer.extend(bytes(length - len(buffer)))
        view = memoryview(buffer)[:length]
        filled = 0
        while filled < length:
            got = self.rfile.readinto(view[filled:])
            if not got:
                raise ProtocolError("connection closed inside a frame")
            filled += got
        return kind, view

    def _header(self) -> tuple[int, int] | None:
        header = self.rfile.read(HEADER_SIZE)
        if not header:
            return None
        if len(header) < HEADER_SIZE:
            raise ProtocolError("connection closed inside a frame header")
        return parse_header(header)

    def send_data(self, kind: int, data: bytes) -> None:
        header = HEADER.pack(kind, len(data))
        with self.send_lock:
            pending, self.pending = self.pending, b""
            sent = self.sock.sendmsg([pending, header, data])
            total = len(pending) + HEADER_SIZE + len(data)
            if sent < total:
                # A signal (SIGCHLD) can interrupt a large send part-way.
                self.sock.sendall((pending + header + data)[sent:])

    def send(self, message: dict[str, Any]) -> None:
        with self.send_lock:
            pending, self.pending = self.pending, b""
            self.sock.sendall(pending + encode_json(message))

    def passes_fds(self, request: dict[str, Any]) -> bool:
        """Whether the client asked for descriptors and can receive them (a unix socket)."""
        return bool(request.get("passFd")) and self.sock.family == socket.AF_UNIX

    def send_with_fd(self, message: dict[str, Any], fd: int) -> None:
        """``message`` carrying a duplicate of ``fd`` (SCM_RIGHTS); the first of the answer."""
        with self.send_lock:
            socket.send_fds(self.sock, [encode_json(message)], [fd])

    def defer(self, message: dict[str, Any]) -> None:
        """Send ``message`` with whatever is sent next (one wake-up of the client for both), or at
        ``flush``."""
        with self.send_lock:
            self.pending += encode_json(message)

    def flush(self) -> None:
        with self.send_lock:
            pending, self.pending = self.pending, b""
            if pending:
                self.sock.sendall(pending)

    def close(self) -> None:
        # shutdown() first: it wakes a thread blocked reading this socket, which close() would not.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.rfile.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class Drainer:
    """Reads and discards output of pipes whose command has finished but whose background children
    still hold them, so those children neither block on a full pipe nor die of EPIPE."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._pending: list[int] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="drainer", daemon=True).start()

    def adopt(self, fd: int) -> None:
        with self._lock:
            self._pending.append(fd)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        buffer = bytearray(CHUNK_SIZE)
        while True:
            for key, _ in self._selector.select():
                fd = key.fd
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(fd, 4096)
                    with self._lock:
                        pending, self._pending = self._pending, []
                    for new_fd in pending:
                        os.set_blocking(new_fd, False)
                        self._selector.register(new_fd, selectors.EVENT_READ)
                    continue
                try:
                    count = os.readv(fd, [buffer])
                except BlockingIOError:
                    continue
                except OSError:
                    count = 0
                if count == 0:
                    self._selector.unregister(fd)
                    os.close(fd)


class Children:
    """Registry of spawned children and the reaper thread that collects every exit status.

    The reaper blocks in ``waitpid(-1)``, which also collects orphans re-parented to the daemon when
    it is PID 1. A thread rather than a SIGCHLD handler: Python runs signal handlers on the main
    thread only, which sits in ``accept()`` and would not be woken by a signal delivered elsewhere.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiters: dict[int, tuple[threading.Event, list[int]]] = {}
        self.groups: set[int] = set()
        threading.Thread(target=self._reap_forever, name="reaper", daemon=True).start()

    def spawn(self, argv: list[str], **kwargs: Any) -> tuple[int, threading.Event, list[int]]:
        # The lock spans Popen and registration so a child that exits at once is still known when
        # the reaper (blocked on the lock) looks it up.
        with self._lock:
            proc = subprocess.Popen(argv, **kwargs)
            # The reaper owns waiting; a finished-looking Popen never polls the pid (which could be
            # reused) later.
            proc.returncode = 0
            event = threading.Event()
            status: list[int] = []
            self._waiters[proc.pid] = (event, status)
            self.groups.add(proc.pid)
            self._wake.notify()
        # The launcher lowers the daemon's OOM score so a memory hog is killed rather than the daemon;
        # what the daemon starts must not inherit that protection. (Raising it is always allowed.)
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/oom_score_adj", "w") as f:
            f.write("0")
        return proc.pid, event, status

    def _reap_forever(self) -> None:
        while True:
            with self._lock:
                if not self._waiters:
                    # Nothing of ours runs; still sweep up orphans now and then.
                    self._wake.wait(1.0)
                blocking = bool(self._waiters)
            try:
                pid, wait_status = os.waitpid(-1, 0 if blocking else os.WNOHANG)
            except ChildProcessError:
                if blocking:
                    time.sleep(0.001)
                continue
            except InterruptedError:
                continue
            if pid == 0:
                continue
            with self._lock:
                waiter = self._waiters.pop(pid, None)
            if waiter is not None:
                waiter[1].append(os.waitstatus_to_exitcode(wait_status))
                waiter[0].set()

    def collect(self, pid: int) -> None:
        """Reap ``pid`` now if it has exited, sparing its waiter the hand-off from the reaper thread."""
        with self._lock:
            waiter = self._waiters.get(pid)
            if waiter is None:
                return  # already reaped
            try:
                reaped, wait_status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # the reaper thread has it: its waiter is about to be told
            if reaped != pid:
                return
            del self._waiters[pid]
        waiter[1].append(os.waitstatus_to_exitcode(wait_status))
        waiter[0].set()

    def forget(self, pid: int) -> None:
        with self._lock:
            self.groups.discard(pid)


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.extra_env: dict[str, str] = {}
        # Closed while a background exchange (or the control plane's fallback after it) is pending.
        self._credentials_ready = threading.Event()
        self._credentials_ready.set()
        self._credentials_deadline = 0.0
        self.started_at = time.monotonic()
        self.children = Children()
        self.drainer = Drainer()
        self._handlers = {
            "ping": self.op_ping,
            "exec": self.op_exec,
            "read": self.op_read,
            "write": self.op_write,
            "process": self.op_process,
            "credentials": self.op_credentials,
            "exchange": self.op_exchange,
        }

    def child_env(self, extra: Mapping[str, str], *, term: str | None = None) -> dict[str, str]:
        """The environment of a command about to start (held while credentials are being fetched)."""
        if not self._credentials_ready.is_set():
            self._credentials_ready.wait(max(0.0, self._credentials_deadline - time.monotonic()))
        cfg = self.config
        env = {
            "HOME": cfg.home,
            "USER": cfg.user,
            "LOGNAME": cfg.user,
            "SHELL": "/bin/bash",
            "PATH": cfg.path,
            "LANG": "C.UTF-8",
        }
        if term:
            env["TERM"] = term
        env.update(cfg.base_env)
        env.update(self.extra_env)
        env.update(extra)
        return env

    def shutdown(self) -> None:
        for pgid in list(self.children.groups):
            _kill_group(pgid)

    # --- connections --------------------------------------------------------------------------

    def handle(self, sock: socket.socket) -> None:
        conn = Connection(sock)
        try:
            reusable = self._serve(conn, kept=False)
            while reusable:
                reusable = self._serve(conn, kept=True)
        finally:
            conn.close()

    def _serve(self, conn: Connection, *, kept: bool) -> bool:
        """One request of the connection; True when it may carry another (see REUSABLE_OPS)."""
        try:
            try:
                request = self._authenticate(conn, kept=kept)
            except RequestError as exc:
                self._send_error(conn, exc)
                return False
            if request is None:
                return False
            op = request.get("op")
            handler = self._handlers.get(op) if isinstance(op, str) else None
            try:
                if handler is None:
                    raise RequestError(ErrorCode.BAD_REQUEST, f"unknown operation {op!r}")
                handler(request, conn)
            except RequestError as exc:
                self._send_error(conn, exc)
                return False
            except ClientGone:
                return False
            return op in REUSABLE_OPS
        except (ProtocolError, OSError) as exc:
            del exc  # the client went away or spoke nonsense; nothing to report to it
        except Exception:
            import traceback  # only on this rare path: it is slow to import

            log(f"request failed:\n{traceback.format_exc()}")
            self._send_error(conn, RequestError(ErrorCode.INTERNAL, "internal daemon error"))
        return False

    def _authenticate(self, conn: Connection, *, kept: bool = False) -> dict[str, Any] | None:
        """The connection's next request, its secret checked; None when the client closed it (or,
        on a kept connection, sent nothing for IDLE_CONNECTION_SECONDS)."""
        conn.sock.settimeout(IDLE_CONNECTION_SECONDS if kept else AUTH_TIMEOUT_SECONDS)
        try:
            first = conn.read_frame()
        except TimeoutError:
            if kept:
                return None
            raise RequestError(ErrorCode.UNAUTHORIZED, "no request received") from None
        conn.sock.settimeout(None)
        if first is None:
            return None
        kind, payload = first
        if kind != Kind.JSON:
            raise RequestError(ErrorCode.UNAUTHORIZED, "the first frame must be the request")
        request = decode_json(payload)
        offered = request.pop("secret", None)
        if not isinstance(offered, str) or not hmac.compare_digest(offered.encode(), self.config.secret):
            raise RequestError(ErrorCode.UNAUTHORIZED, "invalid secret")
        if request.get("v") != PROTOCOL_VERSION:
            raise RequestError(ErrorCode.BAD_REQUEST, f"protocol version {PROTOCOL_VERSION} required")
        return request

    @staticmethod
    def _send_error(conn: Connection, exc: RequestError) -> None:
        with contextlib.suppress(OSError):
            conn.send({"type": "error", "code": str(exc.code), "message": exc.message})

    # --- operations ---------------------------------------------------------------------------

    def op_ping(self, request: dict[str, Any], conn: Connection) -> None:
        conn.send(
            {
                "type": "pong",
                "version": PROTOCOL_VERSION,
                "pid": os.getpid(),
                "uptimeSeconds": round(time.monotonic() - self.started_at, 3),
                "hostname": socket.gethostname(),
            }
        )

    def _write_config(self, config: object) -> None:
        if not isinstance(config, dict):
            raise RequestError(ErrorCode.BAD_REQUEST, "config must be an object")
        target = os.path.join(self.config.home, ".svc.config")
        body = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
        tmp = f"{target}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, body)
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _errno_error(exc, target) from exc

    def op_credentials(self, request: dict[str, Any], conn: Connection) -> None:
        env = _env_mapping(request.get("env"), "env")
        config = request.get("config")
        if config is not None:
            self._write_config(config)
        self.extra_env = env
        self._credentials_ready.set()
        conn.send({"type": "ok"})

    def op_exchange(self, request: dict[str, Any], conn: Connection) -> None:
        """Authenticate the sandbox itself: present the identity token to the service's RFC 8693
        token exchange from inside, then install the token it returns (~/.svc.config, SVC_API_KEY).

        With ``background``, the daemon first answers ``accepted`` and holds every exec and process
        started from then on until the token is installed: a create can answer without waiting for
        the exchange, and the first command still sees its credentials. A failed background exchange
        keeps holding them for the control plane's own exchange (``credentials``), at most
        CREDENTIALS_WAIT_SECONDS in all.
        """
        url, identity, base_url = request.get("url"), request.get("identityToken"), request.get("baseUrl")
        extra = request.get("config") or {}
        if not all(isinstance(v, str) and v for v in (url, identity, base_url)) or not isinstance(extra, dict):
            raise RequestError(ErrorCode.BAD_REQUEST, "url, identityToken and baseUrl are required")
        if request.get("background"):
            self._credentials_deadline = time.monotonic() + CREDENTIALS_WAIT_SECONDS
            self._credentials_ready.clear()
            conn.send({"type": "accepted"})
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token": str(identity),
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        }
        status, body = _post_form(str(url), form, EXCHANGE_TIMEOUT_SECONDS)
        if status != 200:
            detail = body[:500].decode(errors="replace")
            raise RequestError(ErrorCode.EXCHANGE_FAILED, f"token exchange refused ({status}): {detail}")
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise RequestError(ErrorCode.EXCHANGE_FAILED, "token exchange answered without a token")
        token, expires_in = answer.get("access_token"), answer.get("expires_in")
        if not isinstance(token, str) or not isinstance(expires_in, int):
            raise RequestError(ErrorCode.EXCHANGE_FAILED, "token exchange answered without a token")
        expires_at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() + expires_in))
        self._write_config({**extra, "baseUrl": base_url, "token": token, "expiresAt": expires_at})
        self.extra_env = {**self.extra_env, "SVC_API_KEY": token, "SVC_BASE_URL": str(base_url)}
        self._credentials_ready.set()
        conn.send({"type": "ok", "expiresIn": expires_in, "tokenPrefix": token[:14]})

    def _workdir(self, request: dict[str, Any]) -> str:
        workdir = _require_absolute(request.get("workdir") or self.config.home, "workdir")
        if not os.path.isdir(workdir):
            raise RequestError(ErrorCode.WORKDIR_MISSING, f"working directory {workdir} does not exist")
        return workdir

    def op_exec(self, request: dict[str, Any], conn: Connection) -> None:
        command = request.get("command")
        if not isinstance(command, str):
            raise RequestError(ErrorCode.BAD_REQUEST, "command must be a string")
        if "\x00" in command:
            raise RequestError(ErrorCode.BAD_REQUEST, "command contains a NUL byte")
        timeout = request.get("timeout")
        if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0):
            raise RequestError(ErrorCode.BAD_REQUEST, "timeout must be a positive number")
        workdir = self._workdir(request)
        env = self.child_env(_env_mapping(request.get("env"), "env"))

        command_fd: int | None = None
        if len(command) > ARGV_COMMAND_LIMIT // 4 and len(command.encode()) > ARGV_COMMAND_LIMIT:
            command_fd = os.memfd_create("command", 0)
            os.write(command_fd, command.encode())
            os.lseek(command_fd, 0, os.SEEK_SET)
            # Expansion happens before the redirection, so the command is read and then its fd closed,
            # and nothing the command starts inherits it.
            argv = ["/bin/bash", "-c", f'eval "$(</dev/fd/{command_fd})" {command_fd}<&-']
        else:
            argv = ["/bin/bash", "-c", command]

        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        for fd in (out_w, err_w):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
        try:
            pid, exited, status = self.children.spawn(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                cwd=workdir,
                env=env,
                start_new_session=True,
                pass_fds=(command_fd,) if command_fd is not None else (),
            )
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            raise RequestError(ErrorCode.SPAWN_FAILED, f"could not start bash: {exc}") from exc
        finally:
            os.close(out_w)
            os.close(err_w)
            if command_fd is not None:
                os.close(command_fd)
        deadline = time.monotonic() + float(timeout) if timeout is not None else None
        self._supervise(
            pid,
            exited,
            status,
            conn,
            {out_r: Kind.DATA, err_r: Kind.DATA2},
            deadline,
            client_fd=conn.sock.fileno(),
            client_closed=lambda: self._client_closed(conn),
        )

    def _supervise(
        self,
        pid: int,
        exited: threading.Event,
        status: list[int],
        conn: Connection,
        outputs: dict[int, Kind],
        deadline: float | None,
        *,
        client_fd: int,
        client_closed: Callable[[], bool],
        hangup_first: bool = False,
    ) -> None:
        """Stream a child's output until it exits, enforcing the deadline and the client's presence."""
        selector = selectors.DefaultSelector()
        pidfd: int | None = None
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(pid)
        for fd in outputs:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        selector.register(client_fd, selectors.EVENT_READ)
        timed_out = False
        gone = False
        linger_until: float | None = None
        try:
            # "started" goes out with the first output or the exit, whichever comes first, or on its
            # own after STARTED_DELAY_SECONDS: a short command then costs the client one wake-up.
            conn.defer({"type": "started", "pid": pid})
            started_by = time.monotonic() + STARTED_DELAY_SECONDS
            while outputs:
                now = time.monotonic()
                if conn.pending and now >= started_by:
                    conn.flush()
                if exited.is_set() and linger_until is None:
                    linger_until = now + LINGER_SECONDS
                limits = [t for t in (deadline, linger_until) if t is not None]
                wait = min(limits) - now if limits else None
                if pidfd is None and not exited.is_set():
                    wait = 0.05 if wait is None else min(wait, 0.05)
                if conn.pending and (wait is None or wait > started_by - now):
                    wait = started_by - now  # positive: it was flushed above otherwise
                if wait is not None and wait <= 0:
                    if linger_until is not None and now >= linger_until:
                        break
                    timed_out = True
                    break
                for key, _ in selector.select(wait):
                    fd = key.fd
                    if fd == pidfd:
                        # Exit is signalled here; the status is collected at once (or, if the
                        # reaper thread was quicker, arrives from it).
                        selector.unregister(fd)
                        self.children.collect(pid)
                        exited.wait(1.0)
                        continue
                    if fd == client_fd:
                        if client_closed():
                            gone = True
                            selector.unregister(fd)
                        continue
                    try:
                        data = os.read(fd, CHUNK_SIZE)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        # A PTY master reports EIO once every slave descriptor is closed: its EOF.
                        if exc.errno != errno.EIO:
                            raise
                        data = b""
                    if not data:
                        selector.unregister(fd)
                        os.close(fd)
                        del outputs[fd]
                        continue
                    try:
                        if deadline is not None:
                            conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
                        conn.send_data(outputs[fd], data)
                    except TimeoutError:
                        timed_out = True
                    except OSError:
                        gone = True
                    finally:
                        if deadline is not None:
                            with contextlib.suppress(OSError):
                                conn.sock.settimeout(None)
                if gone or timed_out:
                    break
            if gone or timed_out:
                if hangup_first and gone and not exited.is_set():
                    _kill_group(pid, signal.SIGHUP)
                    exited.wait(0.5)
                _kill_group_until_gone(pid)
            # Output is complete (or abandoned); wait for the exit status itself.
            while not exited.wait(0.05):
                if pidfd is None and (gone or timed_out):
                    _kill_group(pid)
            if gone:
                raise ClientGone
            code, signame = _exit_code(status[0])
            if timed_out:
                code = TIMEOUT_EXIT_CODE
            conn.send({"type": "exit", "exitCode": code, "timedOut": timed_out, "signal": signame})
        finally:
            selector.close()
            if pidfd is not None:
                os.close(pidfd)
            # Pipes still open belong to background processes now.
            for fd in outputs:
                self.drainer.adopt(fd)
            self.children.forget(pid)

    @staticmethod
    def _client_closed(conn: Connection) -> bool:
        """Readable client socket during a one-way request: EOF means the client is gone."""
        try:
            data = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not data:
            return True
        # Unexpected input on a one-way request: consume it so the socket stops polling readable.
        with contextlib.suppress(OSError):
            conn.sock.recv(65536, socket.MSG_DONTWAIT)
        return False

    def op_process(self, request: dict[str, Any], conn: Connection) -> None:
        argv = request.get("argv")
        command = request.get("command")
        if argv is not None:
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise RequestError(ErrorCode.BAD_REQUEST, "argv must be a non-empty list of strings")
        elif isinstance(command, str):
            argv = ["/bin/bash", "-c", command]
        else:
            argv = ["/bin/bash", "-l"]
        use_pty = bool(request.get("pty"))
        workdir = self._workdir(request)
        term_value = request.get("term")
        term = term_value if isinstance(term_value, str) and term_value else "xterm-256color"
        env = self.child_env(_env_mapping(request.get("env"), "env"), term=term if use_pty else None)

        if use_pty:
            master, slave = os.openpty()
            os.set_inheritable(master, False)
            _set_winsize(slave, request.get("cols"), request.get("rows"))
            try:
                # setsid(1) -c makes the terminal on stdin the controlling terminal of a new session;
                # doing that in Python would need preexec_fn, which is unsafe in a threaded process.
                pid, exited, status = self.children.spawn(
                    ["setsid", "-c", *argv], stdin=slave, stdout=slave, stderr=slave, cwd=workdir, env=env
                )
            except OSError as exc:
                os.close(master)
                raise RequestError(ErrorCode.SPAWN_FAILED, f"could not start {argv[0]}: {exc}") from exc
            finally:
                os.close(slave)
            stdin_fd = os.dup(master)
            outputs = {master: Kind.DATA}
        else:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            try:
                pid, exited, status = self.children.spawn(
                    argv, stdin=in_r, stdout=out_w, stderr=err_w, cwd=workdir, env=env, start_new_session=True
                )
            except OSError as exc:
                for fd in (in_w, out_r, err_r):
                    os.close(fd)
                raise RequestError(ErrorCode.SPAWN_FAILED, f"could not start {argv[0]}: {exc}") from exc
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
            stdin_fd = in_w
            outputs = {out_r: Kind.DATA, err_r: Kind.DATA2}

        feeder_done = threading.Event()
        feeder = threading.Thread(
            target=self._feed_input,
            args=(conn, pid, stdin_fd, use_pty, feeder_done),
            name=f"stdin-{pid}",
            daemon=True,
        )
        feeder.start()
        try:
            self._supervise_process(pid, exited, status, conn, outputs, feeder_done)
        finally:
            feeder_done.set()

    def _supervise_process(
        self,
        pid: int,
        exited: threading.Event,
        status: list[int],
        conn: Connection,
        outputs: dict[int, Kind],
        client_gone: threading.Event,
    ) -> None:
        # The input thread owns reading from the client and flags a hang-up; a pipe turns that flag
        # into something the output loop can wait on.
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC)

        def watch() -> None:
            client_gone.wait()
            with contextlib.suppress(OSError):
                os.write(wake_w, b"x")

        threading.Thread(target=watch, daemon=True).start()
        try:
            self._supervise(
                pid,
                exited,
                status,
                conn,
                outputs,
                None,
                client_fd=wake_r,
                client_closed=lambda: True,
                hangup_first=True,
            )
        finally:
            client_gone.set()
            os.close(wake_r)
            os.close(wake_w)

    def _feed_input(self, conn: Connection, pid: int, stdin_fd: int, use_pty: bool, done: threading.Event) -> None:
        open_fd: int | None = stdin_fd
        try:
            while not done.is_set():
                try:
                    item = conn.read_frame()
                except (ProtocolError, OSError, ValueError):
                    item = None
                if item is None:
                    return
                kind, payload = item
                if kind == Kind.DATA:
                    if open_fd is not None and payload:
                        try:
                            _write_all(open_fd, payload)
                        except OSError:
                            # The process closed its input (or exited): later input has nowhere to go.
                            os.close(open_fd)
                            open_fd = None
                    continue
                if kind != Kind.JSON:
                    continue
                try:
                    message = decode_json(payload)
                except ProtocolError:
                    return
                kind_name = message.get("type")
                if kind_name == "resize" and use_pty and open_fd is not None:
                    _set_winsize(open_fd, message.get("cols"), message.get("rows"))
                elif kind_name == "signal":
                    name = message.get("signal")
                    sig = getattr(signal, f"SIG{name}", None) if isinstance(name, str) else None
                    if isinstance(sig, signal.Signals):
                        _kill_group(pid, sig)
                elif kind_name == "eof" and open_fd is not None:
                    if use_pty:
                        with contextlib.suppress(OSError):
                            os.write(open_fd, b"\x04")
                    else:
                        os.close(open_fd)
                        open_fd = None
        finally:
            if open_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(open_fd)
            done.set()

    def op_read(self, request: dict[str, Any], conn: Connection) -> None:
        path = _require_absolute(request.get("path"))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise _errno_error(exc, path) from exc
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise RequestError(ErrorCode.IS_DIRECTORY, f"{path}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise RequestError(ErrorCode.BAD_REQUEST, f"{path}: not a regular file")
            os.set_blocking(fd, True)
            if conn.passes_fds(request):
                # A client on this machine reads the file itself: the descriptor opened here (as
                # the sandbox's user, in its mount namespace) travels with the answer, and the bytes
                # are not copied through this process and a socket on their way.
                conn.send_with_fd({"type": "ok", "size": st.st_size, "fd": True}, fd)
                return
            # The file as it was sized when opened: exactly that many bytes, so the size announced
            # first (the HTTP Content-Length) holds even while something appends to it. A file
            # truncated meanwhile ends short, which the client sees as an incomplete body.
            conn.send({"type": "ok", "size": st.st_size})
            sent = 0
            while sent < st.st_size:
                try:
                    data = os.read(fd, min(CHUNK_SIZE, st.st_size - sent))
                except OSError as exc:
                    raise _errno_error(exc, path) from exc
                if not data:
                    break
                conn.send_data(Kind.DATA, data)
                sent += len(data)
            conn.send({"type": "done", "size": sent})
        finally:
            os.close(fd)

    def op_write(self, request: dict[str, Any], conn: Connection) -> None:
        path = _require_absolute(request.get("path"))
        if path.endswith("/"):
            raise RequestError(ErrorCode.IS_DIRECTORY, f"{path}: is a directory")
        mode = request.get("mode")
        if mode is not None and (not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777):
            raise RequestError(ErrorCode.BAD_REQUEST, "mode must be an integer permission value")
        parent, name = os.path.split(path)
        try:
            existing = os.stat(path)
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise _errno_error(exc, path) from exc
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                raise RequestError(ErrorCode.IS_DIRECTORY, f"{path}: is a directory")
            if mode is None:
                mode = stat.S_IMODE(existing.st_mode)
        try:
            os.makedirs(parent, exist_ok=True)
        except FileExistsError:
            raise RequestError(ErrorCode.NOT_A_DIRECTORY, f"{parent}: exists and is not a directory") from None
        except OSError as exc:
            raise _errno_error(exc, parent) from exc
        tmp = os.path.join(parent, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _errno_error(exc, parent) from exc
        committed = False
        try:
            size = 0
            buffer: bytearray | None
            if conn.passes_fds(request):
                # A client on this machine writes the temporary file itself (see op_read); this
                # side only waits for its end, then commits as usual.
                conn.send_with_fd({"type": "ready", "fd": True}, fd)
                ending = conn.read_frame()
                if ending is None:
                    raise ClientGone
                end = decode_json(ending[1]) if ending[0] == Kind.JSON else {}
                if end.get("type") != "end":
                    raise RequestError(ErrorCode.BAD_REQUEST, "expected an end message")
                size = os.fstat(fd).st_size
                if end.get("size") != size:
                    raise RequestError(ErrorCode.BAD_REQUEST, f"the file holds {size} bytes, not {end.get('size')}")
                buffer = None
            else:
                conn.send({"type": "ready"})
                buffer = bytearray(CHUNK_SIZE)
            while buffer is not None:
                item = conn.read_frame_into(buffer)
                if item is None:
                    raise ClientGone
                kind, payload = item
                with payload:
                    # Released at once: a buffer with a view on it cannot grow for a larger frame.
                    if kind == Kind.DATA:
                        try:
                            _write_all(fd, payload)
                        except OSError as exc:
                            raise _errno_error(exc, path) from exc
                        size += len(payload)
                    elif kind == Kind.JSON and decode_json(bytes(payload)).get("type") == "end":
                        break
                    else:
                        raise RequestError(ErrorCode.BAD_REQUEST, "expected data frames and then an end message")
            os.fchmod(fd, mode if mode is not None else 0o644)
            os.close(fd)
            fd = -1
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _errno_error(exc, path) from exc
            committed = True
            conn.send({"type": "done", "path": path, "size": size})
        finally:
            if fd >= 0:
                os.close(fd)
            if not committed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # A PTY master shares O_NONBLOCK with the descriptor the output loop reads.
            select.select([], [fd], [], 1.0)


def _post_form(url: str, form: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """POST a form to the service; its status and body.

    http.client directly: urllib.request builds an opener of a dozen handlers per call, which the
    first command of a new sandbox waits for. Unreachable or broken answers raise RequestError.
    """
    # Imported here, not at the module's top: serve() imports them before the daemon says it is
    # ready (see there), and nothing else that loads this module pays for them.
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestError(ErrorCode.BAD_REQUEST, f"token exchange URL {url!r} is not an http(s) URL")
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = urllib.parse.urlencode(form).encode()
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise RequestError(ErrorCode.EXCHANGE_FAILED, f"token exchange unreachable: {exc}") from None
    finally:
        connection.close()


def _preload_http_client() -> None:
    with contextlib.suppress(Exception):
        import http.client  # noqa: F401
        import urllib.parse  # noqa: F401

        # A process's first name lookup imports the IDNA codec (socket encodes every host name with
        # it) and unicodedata: 2 ms inside a sandbox, on the exchange's connect, which the first
        # command waits for. A numeric lookup is enough to load them and asks no resolver.
        socket.getaddrinfo("127.0.0.1", None, 0, socket.SOCK_STREAM)


def serve(config: DaemonConfig, sock: socket.socket, *, ready_fd: int | None = None) -> None:
    daemon = Daemon(config)
    workers = Workers(daemon.handle)
    stop = threading.Event()

    def request_stop(_signum: int, _frame: Any) -> None:
        stop.set()
        # Unblock accept() on the main thread.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    sock.setblocking(True)
    # The token exchange needs http.client (tens of milliseconds to import) and every request a
    # thread: both are ready before the daemon says it is. A warm-pool sandbox is claimed the moment
    # it is ready, and an import still running then would hold the interpreter while the create
    # waits for the exchange to be taken on and the first command waits for its token; a cold start
    # hands over its exchange right away, which would wait for the import just the same.
    _preload_http_client()
    workers.start_resident()
    if ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, b"1")
        os.close(ready_fd)
    while not stop.is_set():
        try:
            client, _ = sock.accept()
        except OSError:
            if stop.is_set():
                break
            time.sleep(0.01)
            continue
        client.set_inheritable(False)
        workers.dispatch(client)
    daemon.shutdown()
