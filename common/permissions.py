"""Default API permission: an authenticated organization member; read-only tokens only read."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions
from rest_framework.request import Request

from common.errors import ApiError
from common.principal import Principal


class ReadOnlyToken(exceptions.PermissionDenied):
    default_detail = "This token is read-only."
    default_code = "read_only_token"


def require_writable(principal: Principal) -> None:
    """For views outside DRF (served from ASGI): refuse a read-only token as DRF's permission does."""
    if principal.read_only:
        raise ApiError(status_code=403, code=ReadOnlyToken.default_code, message=str(ReadOnlyToken.default_detail))


class IsOrganizationMember(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.auth
        if not isinstance(principal, Principal):
            raise exceptions.NotAuthenticated()
        if principal.read_only and request.method not in permissions.SAFE_METHODS:
            # A view that is a "call" rather than a write (tool calls) opts in explicitly.
            if not getattr(view, "read_only_tokens_may_post", False):
                raise ReadOnlyToken()
        return True


class IsOrganizationAdmin(IsOrganizationMember):
    """Owners and admins only, for unsafe methods; reads stay open to members."""

    message = "Only organization owners and admins may do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        super().has_permission(request, view)
        if request.method in permissions.SAFE_METHODS:
            return True
        principal = request.auth
        assert isinstance(principal, Principal)
        return principal.is_admin
