from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from toolapi import catalog, services
from toolapi.models import McpServer, McpTool, ToolCall


class McpServerForm(forms.ModelForm[McpServer]):
    # Write-only: blank keeps the stored headers, since their values are never shown back.
    new_headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Replace the upstream headers: a JSON object such as {"Authorization": "Bearer …"}. '
        "Leave blank to keep the current ones; {} removes them.",
    )

    class Meta:
        model = McpServer
        fields = ["organization", "name", "description", "url", "enabled", "visibility", "teams", "timeout_seconds"]

    def clean_new_headers(self) -> dict[str, str] | None:
        raw = self.cleaned_data.get("new_headers", "").strip()
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from exc
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise forms.ValidationError("An object of header names to string values.")
        return {str(k): v for k, v in value.items()}

    def save(self, commit: bool = True) -> McpServer:
        server = super().save(commit=False)
        headers = self.cleaned_data.get("new_headers")
        if headers is not None:
            server.set_headers(headers)
        if commit:
            server.save()
            self.save_m2m()
        # Calls look tools up through a short-lived cache; a server changed here must not keep its
        # old settings (or tools) there. The admin saves inside a transaction: drop them again at commit.
        catalog.forget_tools()
        transaction.on_commit(catalog.forget_tools)
        return server


class McpToolInline(admin.TabularInline[McpTool, McpServer]):
    model = McpTool
    extra = 0
    can_delete = False
    fields = ["name", "upstream_name", "title"]
    readonly_fields = ["name", "upstream_name", "title"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin[McpServer]):
    form = McpServerForm
    list_display = ["name", "organization", "url", "enabled", "visibility", "health", "last_checked_at"]
    list_filter = ["enabled", "visibility", "health"]
    search_fields = ["name", "url", "organization__slug"]
    readonly_fields = ["header_names", "health", "last_error", "last_checked_at", "catalog_changed_at"]
    filter_horizontal = ["teams"]
    inlines = [McpToolInline]
    actions = ["refresh_tools"]

    @admin.action(description="Refresh tools now")
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            outcome = services.refresh_server_tools(server=server)
            level = messages.SUCCESS if outcome.ok else messages.ERROR
            self.message_user(request, f"{server.name}: {outcome.tool_count} tools {outcome.error}", level)


@admin.register(McpTool)
class McpToolAdmin(admin.ModelAdmin[McpTool]):
    list_display = ["name", "server", "organization", "upstream_name"]
    search_fields = ["name", "upstream_name", "organization__slug"]
    readonly_fields = [f.name for f in McpTool._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin[ToolCall]):
    list_display = [
        "created_at",
        "tool_name",
        "organization",
        "user",
        "token_prefix",
        "channel",
        "status",
        "duration_ms",
    ]
    list_filter = ["status", "channel", "is_error"]
    search_fields = ["tool_name", "server_name", "user__email", "token_prefix", "organization__slug"]
    readonly_fields = [f.name for f in ToolCall._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
