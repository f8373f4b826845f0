from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from accounts.models import Organization
from audit.models import AuditEvent


def sandbox_events(
    *,
    organization: Organization,
    sandbox_id: str,
    types: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(organization=organization, sandbox_id=sandbox_id)
    if types:
        events = events.filter(event_type__in=types)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events


def sandbox_is_known(*, organization: Organization, sandbox_id: str) -> bool:
    """A sandbox's log is readable as long as the organization ever had that sandbox (even destroyed)."""
    return AuditEvent.objects.filter(organization=organization, sandbox_id=sandbox_id).exists()
