"""The sandbox document written by hand matches what DRF's ModelSerializer writes for it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from sandboxes.api.serializers import SandboxSerializer
from sandboxes.models import DestroyReason, Sandbox, SandboxStatus
from tests.conftest import Actor


def _drf(sandbox: Sandbox) -> dict[str, Any]:
    # The generic representation, field by declared field, that the hand-written one replaces.
    return dict(serializers.ModelSerializer.to_representation(SandboxSerializer(), sandbox))


def _sandbox(owner: Actor, **fields: Any) -> Sandbox:
    defaults: dict[str, Any] = {
        "organization": owner.organization,
        "created_by": owner.user,
        "runtime": "local",
        "last_activity_at": timezone.now(),
    }
    sandbox = Sandbox.objects.create(**{**defaults, **fields})
    sandbox.refresh_from_db()
    return sandbox


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {
            "status": SandboxStatus.RUNNING,
            "limits": {"cpus": 1, "enforcement": [{"name": "memory", "enforced": True}], "network": None},
            "credentials_expires_at": timezone.now() + timedelta(minutes=10),
        },
        {"status": SandboxStatus.RUNNING, "credentials_error": "provisioning failed: refused"},
        {
            "status": SandboxStatus.DESTROYED,
            "destroyed_at": timezone.now(),
            "destroy_reason": DestroyReason.INACTIVITY,
        },
        {"status": SandboxStatus.FAILED, "created_by": None},
    ],
    ids=["creating", "running", "credentials-error", "destroyed", "failed-without-creator"],
)
def test_the_hand_written_document_is_drfs(owner: Actor, fields: dict[str, Any]) -> None:
    sandbox = _sandbox(owner, **fields)
    document = SandboxSerializer(sandbox).data
    assert document == _drf(sandbox)
    assert list(document) == list(_drf(sandbox))  # the same order of keys too
    assert document["createdAt"].endswith("Z")


def test_a_list_uses_the_same_document(owner: Actor) -> None:
    sandboxes = [_sandbox(owner), _sandbox(owner, status=SandboxStatus.RUNNING)]
    assert SandboxSerializer(sandboxes, many=True).data == [_drf(s) for s in sandboxes]
