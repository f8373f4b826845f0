from __future__ import annotations

from typing import Any

from rest_framework import serializers

from audit.models import AuditEvent, EventType


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    type = serializers.CharField(source="event_type")
    sandboxId = serializers.CharField(source="sandbox_id")
    actor = serializers.SerializerMethodField()
    clientAddress = serializers.CharField(source="client_address")
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = AuditEvent
        fields = ["id", "type", "sandboxId", "actor", "clientAddress", "data", "createdAt"]

    def get_actor(self, event: AuditEvent) -> dict[str, Any]:
        return {"userId": event.actor_user_id, "email": event.actor_email, "tokenPrefix": event.token_prefix}


class AuditQuerySerializer(serializers.Serializer[Any]):
    type = serializers.ListField(child=serializers.ChoiceField(choices=EventType.values), required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and since >= until:
            raise serializers.ValidationError({"until": ["Must be later than since."]})
        return attrs
