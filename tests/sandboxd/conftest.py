"""The daemon is tested where it runs: inside real sandboxes of the local runtime."""

from tests.runtimes.conftest import client, local_runtime, runtime_root, sandbox, service_stub

__all__ = ["client", "local_runtime", "runtime_root", "sandbox", "service_stub"]
