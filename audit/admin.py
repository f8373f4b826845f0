from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    list_display = [
        "created_at",
        "event_type",
        "sandbox_id",
        "organization",
        "actor_email",
        "token_prefix",
        "client_address",
    ]
    list_filter = ["event_type"]
    search_fields = ["sandbox_id", "actor_email", "token_prefix", "organization__slug"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    # The log is append-only for everyone, administrators included.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
