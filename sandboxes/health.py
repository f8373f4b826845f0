from __future__ import annotations

from common.health import CheckResult, register_check
from sandboxes.pool import get_pool
from sandboxes.runtime import get_runtime


def check_runtime() -> CheckResult:
    capabilities = get_runtime().capabilities()
    detail = capabilities.as_dict()
    # Limits this host cannot enforce are reported, not hidden: the runtime still works without them.
    detail["unenforced"] = list(capabilities.unenforced)
    pool = get_pool()
    if capabilities.available:
        # The web process is probed here first (at start-up, by `make run` and load balancers), so
        # this is where its pool starts filling, before the first create needs it.
        pool.replenish()
    detail["warmPool"] = pool.status()
    return CheckResult(capabilities.available, detail)


register_check("sandbox_runtime", check_runtime)
