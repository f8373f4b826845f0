"""Readiness checks for /healthz. Apps register their own (the sandbox runtime does)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection


@dataclass
class CheckResult:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


Check = Callable[[], CheckResult]
_checks: dict[str, Check] = {}


def register_check(name: str, check: Check) -> None:
    _checks[name] = check


def check_database() -> CheckResult:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return CheckResult(True, {"vendor": connection.vendor})
    except Exception as exc:  # any failure means "down"; the message tells the operator why
        return CheckResult(False, {"vendor": connection.vendor, "error": str(exc)})


def check_broker() -> CheckResult:
    if settings.REDIS_URL:
        import redis

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=settings.HEALTH_TIMEOUT_SECONDS)
            client.ping()
            return CheckResult(True, {"transport": "redis"})
        except Exception as exc:
            return CheckResult(False, {"transport": "redis", "error": str(exc)})
    queue = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])  # type: ignore[arg-type]
    ok = queue.is_dir()
    return CheckResult(ok, {"transport": "filesystem", "path": str(queue)})


register_check("database", check_database)
register_check("broker", check_broker)


def run_checks() -> dict[str, CheckResult]:
    results: dict[str, CheckResult] = {}
    for name, check in _checks.items():
        try:
            results[name] = check()
        except Exception as exc:
            results[name] = CheckResult(False, {"error": str(exc)})
    return results
