"""Admin pieces shared by the apps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ViewOnlyAdminMixin:
    """No add, change or delete from the admin, for administrators included: records whose changes
    belong to the service (an append-only log, a lifecycle with slots and a runtime behind it)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
