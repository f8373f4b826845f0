from __future__ import annotations

from django.contrib import admin

from audit.models import AuditEvent
from common.admin import ViewOnlyAdminMixin


@admin.register(AuditEvent)
class AuditEventAdmin(ViewOnlyAdminMixin, admin.ModelAdmin[AuditEvent]):
    # The log is append-only for everyone, administrators included.
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
