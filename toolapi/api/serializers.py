from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from toolapi.models import SERVER_NAME_MAX_LENGTH, SERVER_NAME_PATTERN, McpServer, McpTool, ToolCall, Visibility

MAX_HEADERS = 32
# Hop-by-hop and framing headers belong to the transport, not to upstream credentials.
_RESERVED_HEADERS = {"host", "content-length", "content-type", "accept", "connection", "transfer-encoding"}


class ToolSerializer(serializers.ModelSerializer[McpTool]):
    upstreamName = serializers.CharField(source="upstream_name")
    inputSchema = serializers.JSONField(source="input_schema")

    class Meta:
        model = McpTool
        fields = ["id", "name", "upstreamName", "title", "description", "inputSchema"]


class McpServerSerializer(serializers.ModelSerializer[McpServer]):
    headerNames = serializers.SerializerMethodField()
    teamIds = serializers.SerializerMethodField()
    timeoutSeconds = serializers.FloatField(source="timeout_seconds")
    lastError = serializers.CharField(source="last_error")
    lastCheckedAt = serializers.DateTimeField(source="last_checked_at")
    toolCount = serializers.SerializerMethodField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        model = McpServer
        fields = [
            "id",
            "name",
            "description",
            "url",
            "headerNames",
            "enabled",
            "visibility",
            "teamIds",
            "timeoutSeconds",
            "health",
            "lastError",
            "lastCheckedAt",
            "toolCount",
            "createdAt",
            "updatedAt",
        ]
        read_only_fields = fields

    def get_headerNames(self, server: McpServer) -> list[str]:
        return server.header_names

    def get_teamIds(self, server: McpServer) -> list[str]:
        return sorted(team.pk for team in server.teams.all())

    def get_toolCount(self, server: McpServer) -> int:
        return server.tools.count()


class McpServerDetailSerializer(McpServerSerializer):
    tools = serializers.SerializerMethodField()

    class Meta(McpServerSerializer.Meta):
        fields = [*McpServerSerializer.Meta.fields, "tools"]
        read_only_fields = fields

    def get_tools(self, server: McpServer) -> list[dict[str, Any]]:
        return list(ToolSerializer(server.tools.order_by("position", "name"), many=True).data)


def _validate_headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise serializers.ValidationError("An object of header names to values.")
    if len(value) > MAX_HEADERS:
        raise serializers.ValidationError(f"At most {MAX_HEADERS} headers.")
    cleaned: dict[str, str] = {}
    for name, header_value in value.items():
        if not isinstance(name, str) or not name or any(ch in name for ch in " :\r\n\t") or not name.isascii():
            raise serializers.ValidationError(f"Invalid header name: {name!r}.")
        if name.lower() in _RESERVED_HEADERS or name.lower().startswith("mcp-"):
            raise serializers.ValidationError(f"{name} is set by the transport and cannot be configured.")
        if not isinstance(header_value, str) or "\r" in header_value or "\n" in header_value:
            raise serializers.ValidationError(f"The value of {name} must be a single-line string.")
        cleaned[name] = header_value
    return cleaned


class McpServerWriteSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(SERVER_NAME_PATTERN, max_length=SERVER_NAME_MAX_LENGTH)
    url = serializers.URLField(max_length=2000)
    description = serializers.CharField(max_length=1024, allow_blank=True, required=False)
    headers = serializers.JSONField(required=False, write_only=True)
    enabled = serializers.BooleanField(required=False)
    visibility = serializers.ChoiceField(choices=Visibility.choices, required=False)
    teamIds = serializers.ListField(child=serializers.CharField(), required=False)
    timeoutSeconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)

    def validate_url(self, value: str) -> str:
        if not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("Only http and https upstreams are supported.")
        return value

    def validate_headers(self, value: Any) -> dict[str, str]:
        return _validate_headers(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in sorted(unknown)})
        return attrs

    def create_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "name": data["name"],
            "url": data["url"],
            "description": data.get("description", ""),
            "headers": data.get("headers") or {},
            "enabled": data.get("enabled", True),
            "visibility": data.get("visibility", Visibility.ORGANIZATION),
            "team_ids": data.get("teamIds", []),
            "timeout_seconds": data.get("timeoutSeconds", settings.TOOLAPI_DEFAULT_TIMEOUT_SECONDS),
        }

    def update_kwargs(self) -> dict[str, Any]:
        renames = {"teamIds": "team_ids", "timeoutSeconds": "timeout_seconds"}
        return {renames.get(key, key): value for key, value in self.validated_data.items()}


class ToolCallSerializer(serializers.ModelSerializer[ToolCall]):
    serverId = serializers.CharField(source="server_id")
    serverName = serializers.CharField(source="server_name")
    tool = serializers.CharField(source="tool_name")
    userId = serializers.CharField(source="user_id")
    tokenPrefix = serializers.CharField(source="token_prefix")
    isError = serializers.BooleanField(source="is_error")
    durationMs = serializers.FloatField(source="duration_ms")
    requestBytes = serializers.IntegerField(source="request_bytes")
    responseBytes = serializers.IntegerField(source="response_bytes")
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        model = ToolCall
        fields = [
            "id",
            "serverId",
            "serverName",
            "tool",
            "userId",
            "tokenPrefix",
            "channel",
            "status",
            "isError",
            "durationMs",
            "requestBytes",
            "responseBytes",
            "createdAt",
        ]
