"""Celery application: worker and beat share this module.

The beat schedule lives here and only here, one commented entry per periodic job, so an operator can
see at a glance everything that runs on its own.
"""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("svc")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Each entry: what it does and why at that cadence. Intervals come from settings so tests can shrink them.
app.conf.beat_schedule = {
    # Destroy sandboxes idle past SANDBOX_IDLE_SECONDS (30 min): an organization has only 10 slots, so
    # a forgotten sandbox must not hold one for long. Every minute keeps overshoot under a minute.
    "sandboxes-reap-idle": {"task": "sandboxes.reap_idle", "schedule": settings.SANDBOX_REAPER_SECONDS},
    # Renew sandbox API tokens that expire within SANDBOX_CREDENTIALS_MARGIN_SECONDS and retry failed
    # renewals; the margin is many times this interval, so one missed run never lets a token lapse.
    "sandboxes-refresh-credentials": {
        "task": "sandboxes.refresh_credentials",
        "schedule": settings.SANDBOX_CREDENTIALS_REFRESH_SECONDS,
    },
    # Catch drift between the database and the runtime (sandboxes killed from outside, orphans left by
    # a crash); it also runs once when `make run` starts.
    "sandboxes-reconcile": {"task": "sandboxes.reconcile", "schedule": settings.SANDBOX_RECONCILE_SECONDS},
    # Rediscover every MCP server's tools and record its health: catches upstream changes the upstream
    # did not announce; a few minutes keeps catalogs fresh without polling upstreams hard.
    "toolapi-refresh-tool-catalogs": {
        "task": "toolapi.refresh_all_tool_catalogs",
        "schedule": settings.TOOLAPI_REFRESH_SECONDS,
    },
}
