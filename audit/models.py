"""Append-only audit events: what happened in a sandbox, who did it, from where."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from common.ids import PublicIdField


class EventType(models.TextChoices):
    SANDBOX_CREATE = "sandbox.create"
    SANDBOX_DESTROY = "sandbox.destroy"
    EXEC = "sandbox.exec"
    READ_FILE = "sandbox.read_file"
    WRITE_FILE = "sandbox.write_file"
    TERMINAL_OPEN = "terminal.open"
    TERMINAL_CLOSE = "terminal.close"
    SSH_OPEN = "ssh.open"
    SSH_CLOSE = "ssh.close"
    CREDENTIALS_ISSUED = "credentials.issued"
    CREDENTIALS_REFRESH_FAILED = "credentials.refresh_failed"


class AuditEvent(models.Model):
    id = PublicIdField(prefix="evt")
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="audit_events")
    # A plain id, not a foreign key: the log must outlive the sandbox it describes.
    sandbox_id = models.CharField(max_length=40, db_index=True, blank=True)
    event_type = models.CharField(max_length=40, choices=EventType.choices)
    actor_user = models.ForeignKey("accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Snapshots, so the event still says who acted after the user or token is gone.
    actor_email = models.CharField(max_length=254, blank=True)
    token_prefix = models.CharField(max_length=24, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict)
    # When it happened: set by the recorder for events written after the fact (in batches, or once
    # a sandbox's first command is under way), so the log keeps the order things happened in.
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "sandbox_id", "-created_at"])]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.event_type} {self.sandbox_id} {self.created_at:%Y-%m-%d %H:%M:%S}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Append-only: an existing event is never rewritten.
        if not self._state.adding:
            raise ValueError("Audit events are append-only.")
        super().save(*args, **kwargs)
