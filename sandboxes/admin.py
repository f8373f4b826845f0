from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from common.admin import ViewOnlyAdminMixin
from sandboxes import services
from sandboxes.models import DestroyReason, Sandbox


@admin.register(Sandbox)
class SandboxAdmin(ViewOnlyAdminMixin, admin.ModelAdmin[Sandbox]):
    # The lifecycle belongs to the service (slots, runtime, audit): the admin looks and destroys.
    list_display = [
        "id",
        "organization",
        "status",
        "created_by",
        "runtime",
        "created_at",
        "last_activity_at",
        "destroy_reason",
        "credentials_expires_at",
    ]
    list_filter = ["status", "destroy_reason", "runtime"]
    search_fields = ["id", "organization__slug", "created_by__email"]
    date_hierarchy = "created_at"
    # The daemon's secret never leaves the database, not even encrypted.
    exclude = ["daemon_secret_encrypted"]
    readonly_fields = [f.name for f in Sandbox._meta.fields if f.name != "daemon_secret_encrypted"]
    actions = ["destroy_selected"]

    @admin.action(description="Destroy selected sandboxes", permissions=["view"])
    def destroy_selected(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        destroyed = 0
        for sandbox in queryset.select_related("organization"):
            destroyed += services.destroy_sandbox(
                sandbox=sandbox,
                reason=DestroyReason.USER,
                address=request.META.get("REMOTE_ADDR", ""),
                detail=f"destroyed from the admin by {getattr(request.user, 'email', '')}",
            )
        self.message_user(request, f"{destroyed} sandbox(es) destroyed.", messages.SUCCESS)
