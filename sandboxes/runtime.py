"""The configured sandbox runtime, built once per process from settings."""

from __future__ import annotations

import urllib.parse
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
            service_port=service_port(settings.SANDBOX_SERVICE_URL),
            tools_dir=tools if tools.is_dir() else None,
            cpus=settings.SANDBOX_CPUS,
            memory_bytes=settings.SANDBOX_MEMORY_BYTES,
            pids_max=settings.SANDBOX_PIDS_MAX,
        )
    )


def service_port(url: str) -> int | None:
    """The host's loopback port forwarded into sandboxes: the one ``SANDBOX_SERVICE_URL`` names
    (``PORT`` by default; another when a proxy on this host fronts the service). None when the URL
    names another host, which sandboxes reach over their outbound network."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def parse_address(value: str) -> DaemonAddress:
    """Inverse of ``str(DaemonAddress)``: ``unix:/path`` or ``tcp:host:port``."""
    kind, _, rest = value.partition(":")
    if kind == "unix":
        return DaemonAddress(unix_path=rest)
    host, _, port = rest.rpartition(":")
    return DaemonAddress(host=host, port=int(port))
