from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from rest_framework import serializers

from common.errors import ApiError
from sandboxes.models import Sandbox

# One field for every timestamp of the document, written as the declared fields would write them.
_DATETIME = serializers.DateTimeField()


def _datetime(value: datetime | None) -> str | None:
    return None if value is None else str(_DATETIME.to_representation(value))


class SandboxSerializer(serializers.ModelSerializer[Sandbox]):
    """The sandbox document. The declared fields describe it (the OpenAPI schema); ``to_representation``
    writes it by hand, because a ModelSerializer rebuilds its fields for every instance, which cost a
    create more than its database work."""

    createdAt = serializers.DateTimeField(source="created_at")
    lastActivityAt = serializers.DateTimeField(source="last_activity_at")
    idleExpiresAt = serializers.SerializerMethodField()
    destroyedAt = serializers.DateTimeField(source="destroyed_at")
    destroyReason = serializers.CharField(source="destroy_reason")
    createdBy = serializers.SerializerMethodField()
    credentials = serializers.SerializerMethodField()

    class Meta:
        model = Sandbox
        fields = [
            "id",
            "status",
            "runtime",
            "createdAt",
            "lastActivityAt",
            "idleExpiresAt",
            "destroyedAt",
            "destroyReason",
            "createdBy",
            "limits",
            "credentials",
        ]

    def to_representation(self, instance: Sandbox) -> dict[str, Any]:
        return {
            "id": instance.pk,
            "status": str(instance.status),
            "runtime": instance.runtime,
            "createdAt": _datetime(instance.created_at),
            "lastActivityAt": _datetime(instance.last_activity_at),
            "idleExpiresAt": self.get_idleExpiresAt(instance),
            "destroyedAt": _datetime(instance.destroyed_at),
            "destroyReason": str(instance.destroy_reason),
            "createdBy": self.get_createdBy(instance),
            "limits": instance.limits,
            "credentials": self.get_credentials(instance),
        }

    def get_createdBy(self, sandbox: Sandbox) -> dict[str, Any] | None:
        user = sandbox.created_by
        if user is None:
            return None
        return {"id": user.pk, "email": user.email, "name": user.name}

    def get_credentials(self, sandbox: Sandbox) -> dict[str, Any]:
        expires = sandbox.credentials_expires_at
        return {"expiresAt": expires.isoformat() if expires else None, "error": sandbox.credentials_error or None}

    def get_idleExpiresAt(self, sandbox: Sandbox) -> str | None:
        if not sandbox.is_active:
            return None
        return (sandbox.last_activity_at + timedelta(seconds=settings.SANDBOX_IDLE_SECONDS)).isoformat()


@dataclass(frozen=True)
class ExecRequest:
    command: str
    timeout: float
    workdir: str


_EXEC_FIELDS = ("command", "timeout", "workdir")


def parse_exec_request(data: dict[str, Any]) -> ExecRequest:
    """The body of an exec, checked by hand: this runs before every command, and a serializer's
    machinery cost more than a short command's whole relay. Errors: 400 with per-field messages."""
    errors: dict[str, list[str]] = {key: ["Unknown field."] for key in sorted(set(data) - set(_EXEC_FIELDS))}

    command = data.get("command")
    if not isinstance(command, str):
        errors["command"] = ["This field is required."] if command is None else ["Must be a string."]
    elif not command:
        errors["command"] = ["This field may not be blank."]
    elif "\x00" in command:
        errors["command"] = ["Must not contain NUL characters."]
    elif len(command) * 4 > settings.SANDBOX_EXEC_MAX_COMMAND_BYTES and (
        len(command.encode()) > settings.SANDBOX_EXEC_MAX_COMMAND_BYTES
    ):
        errors["command"] = [f"At most {settings.SANDBOX_EXEC_MAX_COMMAND_BYTES} bytes."]

    raw_timeout = data.get("timeout", settings.SANDBOX_EXEC_DEFAULT_TIMEOUT)
    timeout = 0.0
    try:
        if isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int | float | str):
            raise ValueError
        timeout = float(raw_timeout)
    except (ValueError, OverflowError):
        errors["timeout"] = ["A valid number is required."]
    else:
        maximum = settings.SANDBOX_EXEC_MAX_TIMEOUT
        if not 0 < timeout <= maximum:
            errors["timeout"] = [f"Must be greater than 0 and at most {maximum:g} seconds."]

    workdir = data.get("workdir", "/home/ubuntu")
    if not isinstance(workdir, str):
        errors["workdir"] = ["Must be a string."]
    elif not workdir.startswith("/"):
        errors["workdir"] = ["Must be an absolute path."]
    elif "\x00" in workdir:
        errors["workdir"] = ["Must not contain NUL characters."]

    if errors:
        raise ApiError(
            status_code=400, code="validation_error", message="Request is invalid.", details={"fields": errors}
        )
    assert isinstance(command, str) and isinstance(workdir, str)
    return ExecRequest(command, timeout, workdir)
