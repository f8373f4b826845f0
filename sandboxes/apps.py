from __future__ import annotations

import signal
import threading
from types import FrameType

from django.apps import AppConfig
from django.conf import settings


class SandboxesConfig(AppConfig):
    name = "sandboxes"

    def ready(self) -> None:
        from sandboxes import credentials, health  # noqa: F401 - register the exchange resolver and health check

        if (
            settings.SANDBOX_WARM_POOL_SIZE > 0
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            # uvicorn shuts down gracefully on SIGTERM and then raises it again under the handler it
            # found at start-up; with the default action the process would die without running
            # atexit, and the warm pool it filled would outlive it.
            signal.signal(signal.SIGTERM, _drain_pool_then_terminate)


def _drain_pool_then_terminate(signum: int, _frame: FrameType | None) -> None:
    from sandboxes.pool import get_pool

    get_pool().shutdown()  # nothing to do in a process that never filled the pool
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
