"""Recording audit events, and capturing stream output for them within a bounded size."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from accounts.models import Organization, User
from audit.models import AuditEvent
from common.principal import Principal


def client_address(request: HttpRequest | None) -> str:
    if request is None:
        return ""
    return str(request.META.get("REMOTE_ADDR", ""))[:64]


def record_event(
    *,
    organization: Organization,
    event_type: str,
    sandbox_id: str = "",
    principal: Principal | None = None,
    user: User | None = None,
    address: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """Insert one event (``at``: when it happened, if not now). A single INSERT with no
    read-modify-write, so concurrent writers never collide."""
    event = build_event(
        organization=organization,
        event_type=event_type,
        sandbox_id=sandbox_id,
        principal=principal,
        user=user,
        address=address,
        data=data,
        at=at,
    )
    event.save(force_insert=True)
    return event


def record_events(events: list[dict[str, Any]]) -> None:
    """Insert several events (``record_event``'s arguments each) with one statement."""
    AuditEvent.objects.bulk_create([build_event(**event) for event in events])


def build_event(
    *,
    organization: Organization,
    event_type: str,
    sandbox_id: str = "",
    principal: Principal | None = None,
    user: User | None = None,
    address: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """An event as ``record_event`` stores it, not yet saved."""
    actor = principal.user if principal is not None else user
    return AuditEvent(
        created_at=at or timezone.now(),
        organization=organization,
        event_type=event_type,
        sandbox_id=sandbox_id,
        actor_user=actor,
        actor_email=actor.email if actor is not None else "",
        token_prefix=principal.token_prefix if principal is not None else "",
        client_address=address,
        data=data or {},
    )


arecord_event = sync_to_async(record_event, thread_sensitive=False)


@dataclass
class OutputCapture:
    """Keeps the first ``cap`` bytes of a stream for the audit log and counts all of them."""

    cap: int = field(default_factory=lambda: int(settings.AUDIT_OUTPUT_CAP_BYTES))
    total: int = 0
    _chunks: list[bytes] = field(default_factory=list)
    _kept: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - self._kept
        if room > 0:
            piece = chunk[:room]
            self._chunks.append(piece)
            self._kept += len(piece)

    @property
    def truncated(self) -> bool:
        return self.total > self._kept

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")

    def as_dict(self, name: str) -> dict[str, Any]:
        return {name: self.text(), f"{name}Bytes": self.total, f"{name}Truncated": self.truncated}
