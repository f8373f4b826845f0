from __future__ import annotations

from common.health import CheckResult, register_check
from sandboxes.runtime import get_runtime


def check_runtime() -> CheckResult:
    capabilities = get_runtime().capabilities()
    detail = capabilities.as_dict()
    # Limits this host cannot enforce are reported, not hidden: the runtime still works without them.
    detail["unenforced"] = list(capabilities.unenforced)
    return CheckResult(capabilities.available, detail)


register_check("sandbox_runtime", check_runtime)
