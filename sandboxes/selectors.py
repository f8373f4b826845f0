from __future__ import annotations

from django.db.models import QuerySet

from common.errors import ApiError, not_found
from common.principal import Principal
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus


def organization_sandboxes(*, principal: Principal, status: str = "active") -> QuerySet[Sandbox]:
    sandboxes = Sandbox.objects.filter(organization=principal.organization).select_related("created_by")
    if status == "active":
        return sandboxes.filter(status__in=ACTIVE_STATUSES)
    if status == "all":
        return sandboxes
    return sandboxes.filter(status=status)


def get_sandbox(*, principal: Principal, sandbox_id: str) -> Sandbox:
    """Any sandbox of the caller's organization, destroyed ones included; others are 404."""
    sandbox = organization_sandboxes(principal=principal, status="all").filter(pk=sandbox_id).first()
    if sandbox is None:
        raise not_found("Sandbox")
    return sandbox


def get_running_sandbox(*, principal: Principal, sandbox_id: str) -> Sandbox:
    """A sandbox that can take operations; a destroyed one answers 410 with why it is gone."""
    sandbox = get_sandbox(principal=principal, sandbox_id=sandbox_id)
    if sandbox.status == SandboxStatus.RUNNING:
        return sandbox
    if sandbox.status == SandboxStatus.CREATING:
        raise ApiError(status_code=409, code="sandbox_starting", message="The sandbox is still starting.")
    raise ApiError(
        status_code=410,
        code="sandbox_destroyed",
        message=f"The sandbox was destroyed ({sandbox.destroy_reason or sandbox.status}).",
        details={
            "status": sandbox.status,
            "destroyReason": sandbox.destroy_reason,
            "destroyedAt": sandbox.destroyed_at,
        },
    )
