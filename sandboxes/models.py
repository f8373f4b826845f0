"""Sandboxes as the control plane records them. The runtime holds the processes; this holds the facts."""

from __future__ import annotations

from django.db import models

from common.ids import PublicIdField


class SandboxStatus(models.TextChoices):
    # A slot is held while the runtime starts the sandbox.
    CREATING = "creating"
    RUNNING = "running"
    DESTROYED = "destroyed"
    # The runtime could not start it; it holds no slot.
    FAILED = "failed"


# Statuses that count against the organization's limit.
ACTIVE_STATUSES = (SandboxStatus.CREATING, SandboxStatus.RUNNING)


class DestroyReason(models.TextChoices):
    USER = "user"
    INACTIVITY = "inactivity"
    # The runtime no longer had it (host restart, killed from outside).
    VANISHED = "vanished"
    START_FAILED = "start_failed"


class Sandbox(models.Model):
    id = PublicIdField(prefix="sbx")
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="sandboxes")
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="sandboxes")
    status = models.CharField(max_length=16, choices=SandboxStatus.choices, default=SandboxStatus.CREATING)
    runtime = models.CharField(max_length=32)
    # Where the in-sandbox daemon listens, and its secret (encrypted at rest).
    daemon_address = models.CharField(max_length=300, blank=True)
    daemon_secret_encrypted = models.TextField(blank=True)
    limits = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    last_activity_at = models.DateTimeField(db_index=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)
    destroy_reason = models.CharField(max_length=16, choices=DestroyReason.choices, blank=True)
    failure = models.TextField(blank=True)
    # The read-only API token inside the sandbox (~/.svc.config, SVC_API_KEY): when it expires, and the
    # last refresh failure, shown on the sandbox so a broken refresh is never silent.
    credentials_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    credentials_error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "status"])]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES
