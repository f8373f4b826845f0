from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from rest_framework import serializers

from sandboxes.models import Sandbox


class SandboxSerializer(serializers.ModelSerializer[Sandbox]):
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


class ExecRequestSerializer(serializers.Serializer[Any]):
    command = serializers.CharField(allow_blank=False, trim_whitespace=False)
    timeout = serializers.FloatField(required=False)
    workdir = serializers.CharField(required=False, default="/home/ubuntu", trim_whitespace=False)

    def to_internal_value(self, data: Any) -> Any:
        # CharField would turn 42 into "42"; a command or path that is not a string is a client bug.
        if isinstance(data, dict):
            wrong = {
                k: ["Must be a string."] for k in ("command", "workdir") if k in data and not isinstance(data[k], str)
            }
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)

    def validate_command(self, value: str) -> str:
        if len(value.encode()) > settings.SANDBOX_EXEC_MAX_COMMAND_BYTES:
            raise serializers.ValidationError(f"At most {settings.SANDBOX_EXEC_MAX_COMMAND_BYTES} bytes.")
        if "\x00" in value:
            raise serializers.ValidationError("Must not contain NUL characters.")
        return value

    def validate_timeout(self, value: float) -> float:
        maximum = settings.SANDBOX_EXEC_MAX_TIMEOUT
        if not value > 0 or value > maximum:
            raise serializers.ValidationError(f"Must be greater than 0 and at most {maximum:g} seconds.")
        return value

    def validate_workdir(self, value: str) -> str:
        if not value.startswith("/"):
            raise serializers.ValidationError("Must be an absolute path.")
        if "\x00" in value:
            raise serializers.ValidationError("Must not contain NUL characters.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in sorted(unknown)})
        attrs.setdefault("timeout", settings.SANDBOX_EXEC_DEFAULT_TIMEOUT)
        return attrs
