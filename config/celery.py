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
    # Rediscover every MCP server's tools and record its health: catches upstream changes the upstream
    # did not announce; a few minutes keeps catalogs fresh without polling upstreams hard.
    "toolapi-refresh-tool-catalogs": {
        "task": "toolapi.refresh_all_tool_catalogs",
        "schedule": settings.TOOLAPI_REFRESH_SECONDS,
    },
}
