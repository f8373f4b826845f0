"""The configured sandbox runtime, built once per process from settings."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from sandboxes.runtimes.base import DaemonAddress, SandboxRuntime
from sandboxes.runtimes.local import LocalRuntime, LocalRuntimeConfig


@cache
def get_runtime() -> SandboxRuntime:
    # Only the local runtime exists so far; SANDBOX_RUNTIME's choices grow with the backends.
    tools = settings.BASE_DIR / "clients" / "bin"
    return LocalRuntime(
        LocalRuntimeConfig(
            root=settings.SANDBOX_ROOT,
            network=settings.SANDBOX_NETWORK,
            service_port=settings.PORT,
            tools_dir=tools if tools.is_dir() else None,
            cpus=settings.SANDBOX_CPUS,
            memory_bytes=settings.SANDBOX_MEMORY_BYTES,
            pids_max=settings.SANDBOX_PIDS_MAX,
        )
    )


def parse_address(value: str) -> DaemonAddress:
    """Inverse of ``str(DaemonAddress)``: ``unix:/path`` or ``tcp:host:port``."""
    kind, _, rest = value.partition(":")
    if kind == "unix":
        return DaemonAddress(unix_path=rest)
    host, _, port = rest.rpartition(":")
    return DaemonAddress(host=host, port=int(port))
