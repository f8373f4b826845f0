"""What every sandbox runtime provides: lifecycle only.

A runtime starts a sandbox with the sandbox daemon as its first process, says where that daemon
listens and with which secret, lists what it runs (for reconciliation after a restart) and stops it.
Everything that happens inside a sandbox goes through the daemon (``sandboxes.daemon_client``), so a
new backend (Kubernetes) only has to implement this protocol. Plain dataclasses keep it free of Django.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

# Doubles as the sandbox hostname and a path component, hence DNS-label rules.
SANDBOX_ID_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")


class SandboxRuntimeError(Exception):
    """Base class for runtime failures."""


class SandboxCreateError(SandboxRuntimeError):
    """The sandbox could not be started; nothing of it is left running."""


class RuntimeUnavailable(SandboxRuntimeError):  # noqa: N818 - reads as a state, like TimeoutExpired
    """This runtime cannot run sandboxes on this host (missing tool, no user namespaces...)."""


class InvalidSandboxIdError(SandboxRuntimeError, ValueError):
    pass


def validate_sandbox_id(sandbox_id: str) -> str:
    if not SANDBOX_ID_PATTERN.match(sandbox_id):
        raise InvalidSandboxIdError(
            f"invalid sandbox id {sandbox_id!r}: lowercase letters, digits, '-' and '_', at most 63 characters"
        )
    return sandbox_id


@dataclass(frozen=True)
class DaemonAddress:
    """Where a sandbox daemon accepts connections: a unix socket path, or host and port."""

    unix_path: str | None = None
    host: str | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        if (self.unix_path is None) == (self.host is None or self.port is None):
            raise ValueError("a daemon address is either a unix socket path or a host and port")

    def __str__(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"tcp:{self.host}:{self.port}"


@dataclass(frozen=True)
class LimitReport:
    """One resource limit and whether this host actually enforces it."""

    name: str  # "cpu", "memory", "pids", "network", "user"
    enforced: bool
    value: str  # human-readable target, e.g. "1 CPU", "1 GiB", "no host loopback"
    mechanism: str = ""  # how it is enforced, e.g. "cgroup v1 memory.limit_in_bytes"
    detail: str = ""  # why it is not enforced, or caveats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NetworkReport:
    mode: str  # "pasta", "slirp4netns", "none", "host"
    outbound: bool
    host_loopback_blocked: bool
    # Host TCP ports reachable from inside at 127.0.0.1:<port> (the service's own API).
    forwarded_host_ports: tuple[int, ...] = ()
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["forwarded_host_ports"] = list(self.forwarded_host_ports)
        return data


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What the runtime can do on this host, for /healthz and the sandbox detail."""

    runtime: str
    available: bool
    limits: tuple[LimitReport, ...]
    network: NetworkReport
    problems: tuple[str, ...] = ()

    @property
    def unenforced(self) -> tuple[str, ...]:
        return tuple(limit.name for limit in self.limits if not limit.enforced)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "available": self.available,
            "limits": [limit.as_dict() for limit in self.limits],
            "network": self.network.as_dict(),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class SandboxHandle:
    """Everything the control plane needs to talk to a running sandbox."""

    sandbox_id: str
    runtime: str
    address: DaemonAddress
    secret: str = field(repr=False)
    created_at: float  # unix time
    limits: tuple[LimitReport, ...] = ()
    network: NetworkReport | None = None


class SandboxState(enum.StrEnum):
    # Being created right now by a live process: reconciliation must leave it alone.
    STARTING = "starting"
    RUNNING = "running"
    # Known to the runtime (state on disk, a pod object) but its processes are gone.
    EXITED = "exited"


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    state: SandboxState
    handle: SandboxHandle | None
    detail: str = ""
    # A warm-pool member: started ahead of demand, belongs to no organization, has no database row.
    pooled: bool = False
    # When it was taken out of the pool (unix time): its database row may not be committed yet.
    claimed_at: float | None = None


@runtime_checkable
class SandboxRuntime(Protocol):
    """Lifecycle of sandboxes. Calls block; async callers run them in a worker thread."""

    name: str

    def capabilities(self) -> RuntimeCapabilities:
        """What is available and enforced on this host; cheap after the first call."""
        ...

    def create(
        self, sandbox_id: str, *, secret: str | None = None, env: dict[str, str] | None = None, pooled: bool = False
    ) -> SandboxHandle:
        """Start a sandbox whose daemon is ready to accept connections when this returns.

        ``secret`` is generated when not given; ``env`` is added to every exec inside. ``pooled``
        makes it a warm-pool member that ``claim()`` can hand out.
        Raises ``SandboxCreateError`` (and leaves nothing behind) on failure.
        """
        ...

    def claim(self, sandbox_id: str | None = None) -> SandboxHandle | None:
        """Take a running pool member (any, or the one named) out of the pool; None if there is none.

        Exactly once: two callers, in any processes sharing this runtime, never get the same one.
        """
        ...

    def fill_pool(self, size: int, make_id: Callable[[], str], *, stop: Callable[[], bool] = lambda: False) -> int:
        """Start pool members until ``size`` are ready; returns how many it started.

        Safe to call from several processes at once: together they never exceed ``size``.
        """
        ...

    def drain_pool(self) -> list[str]:
        """Claim and destroy every pool member (on shutdown); returns their ids."""
        ...

    def destroy(self, sandbox_id: str) -> bool:
        """Stop the sandbox and delete its state. True if something existed. Idempotent."""
        ...

    def inspect(self, sandbox_id: str) -> SandboxInfo | None: ...

    def list(self) -> list[SandboxInfo]:
        """Every sandbox this runtime knows, running or exited, for reconciliation."""
        ...
