"""The organization's upstream MCP servers, their discovered tools, and the record of every tool call."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from django.db import models

from accounts.models import Organization, Team, User
from common import crypto
from common.ids import PublicIdField

# Server names form the first half of every tool name (`<server>__<tool>`), so they may not contain
# `__` themselves: lowercase words joined by single dashes keep the split unambiguous.
SERVER_NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
SERVER_NAME_MAX_LENGTH = 48
TOOL_SEPARATOR = "__"


class Visibility(models.TextChoices):
    ORGANIZATION = "organization", "Everyone in the organization"
    TEAMS = "teams", "Members of the listed teams"


class Health(models.TextChoices):
    UNKNOWN = "unknown", "Not checked yet"
    OK = "ok", "Reachable"
    ERROR = "error", "Failing"


class McpServer(models.Model):
    id = PublicIdField(prefix="mcps")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.CharField(
        max_length=SERVER_NAME_MAX_LENGTH,
        validators=[RegexValidator(SERVER_NAME_PATTERN, "Lowercase letters, digits and single dashes.")],
    )
    description = models.CharField(max_length=1024, blank=True)
    url = models.URLField(max_length=2000)
    # Upstream credentials (e.g. {"Authorization": "Bearer …"}), Fernet-encrypted JSON; never serialized.
    headers_encrypted = models.TextField(blank=True, default="")
    enabled = models.BooleanField(default=True)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.ORGANIZATION)
    teams = models.ManyToManyField(Team, related_name="mcp_servers", blank=True)
    timeout_seconds = models.FloatField(default=300.0)
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    last_error = models.TextField(blank=True, default="")
    last_checked_at = models.DateTimeField(null=True, blank=True)
    # Bumped whenever anything that shapes the published catalog changes (settings, teams, tools):
    # cached OpenAPI documents are keyed by it, so a bump is the invalidation.
    catalog_changed_at = models.DateTimeField(auto_now_add=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "name"], name="uniq_mcp_server_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.organization_id}/{self.name}"

    @property
    def headers(self) -> dict[str, str]:
        if not self.headers_encrypted:
            return {}
        value: Any = crypto.decrypt_json(self.headers_encrypted)
        return {str(key): str(val) for key, val in value.items()}

    def set_headers(self, headers: dict[str, str]) -> None:
        self.headers_encrypted = crypto.encrypt_json(headers) if headers else ""

    @property
    def header_names(self) -> list[str]:
        return sorted(self.headers)


class McpTool(models.Model):
    id = PublicIdField(prefix="tool")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="mcp_tools")
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    # The name in our API (`<server>__<tool>`), unique in the organization.
    name = models.CharField(max_length=200)
    # The name the upstream knows the tool by.
    upstream_name = models.CharField(max_length=200)
    title = models.CharField(max_length=500, blank=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(null=True, blank=True)
    annotations = models.JSONField(null=True, blank=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "name"], name="uniq_mcp_tool_name")]
        ordering = ["server__name", "position"]

    def __str__(self) -> str:
        return self.name


class CallStatus(models.TextChoices):
    OK = "ok", "Completed"
    TOOL_ERROR = "tool_error", "Tool reported an error"
    INVALID = "invalid_arguments", "Arguments rejected"
    UNREACHABLE = "upstream_unreachable", "Upstream unreachable"
    UPSTREAM_ERROR = "upstream_error", "Upstream protocol error"
    TIMEOUT = "upstream_timeout", "Upstream timed out"
    CANCELLED = "cancelled", "Caller went away"


class CallChannel(models.TextChoices):
    HTTP = "http", "HTTP (JSON)"
    SSE = "sse", "HTTP (event stream)"
    MCP = "mcp", "MCP endpoint"


class ToolCall(models.Model):
    """One tool call through the HTTP API or the MCP endpoint: the audit record of tool use."""

    id = PublicIdField(prefix="call")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="tool_calls")
    server = models.ForeignKey(McpServer, on_delete=models.SET_NULL, null=True, blank=True, related_name="calls")
    # Names are copied so the record survives the server or tool being deleted or renamed.
    server_name = models.CharField(max_length=SERVER_NAME_MAX_LENGTH)
    tool_name = models.CharField(max_length=200)
    user = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="tool_calls")
    token_prefix = models.CharField(max_length=24, blank=True)
    channel = models.CharField(max_length=8, choices=CallChannel.choices)
    status = models.CharField(max_length=32, choices=CallStatus.choices)
    is_error = models.BooleanField(default=False)
    duration_ms = models.FloatField(default=0)
    request_bytes = models.PositiveIntegerField(default=0)
    response_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "-created_at"])]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status})"
