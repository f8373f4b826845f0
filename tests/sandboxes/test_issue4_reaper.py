"""The inactivity reaper run twice at once over live sandboxes: each idle one is destroyed exactly once,
and one whose activity is recorded while the reapers are already under way survives."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from django.db import connection, transaction

from audit.models import AuditEvent, EventType
from sandboxes import services
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.runtime import get_runtime
from tests.conftest import Actor
from tests.sandboxes.conftest import exec_lines, stdout_of

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_SECONDS = 2


def _in_thread(target: Any, results: list[Any], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            results.append(target())
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    return threading.Thread(target=run)


def test_two_reapers_at_once_destroy_each_idle_sandbox_once_and_spare_a_busy_one(
    api: httpx.Client, enabled: Actor, settings: Any
) -> None:
    settings.SANDBOX_IDLE_SECONDS = IDLE_SECONDS
    created = [api.post("/api/v1/sandboxes") for _ in range(4)]
    assert all(response.status_code == 201 for response in created), [r.text for r in created]
    *idle, busy = [str(response.json()["id"]) for response in created]
    time.sleep(IDLE_SECONDS + 0.5)  # all four are idle now, busy included

    # An exec on `busy` starts while the reapers run: they have listed it as idle, and its activity
    # write commits while they wait for its row. It holds the row (the whole database on SQLite)
    # until the reapers are surely past their candidate query.
    locked, release = threading.Event(), threading.Event()

    def exec_starts() -> None:
        with transaction.atomic():
            Sandbox.objects.select_for_update().get(pk=busy)
            locked.set()
            assert release.wait(30)
            services.record_activity(busy)

    results: list[list[str]] = []
    errors: list[BaseException] = []
    activity = _in_thread(exec_starts, [], errors)
    activity.start()
    assert locked.wait(30)
    reapers = [_in_thread(services.reap_idle, results, errors) for _ in range(2)]
    for reaper in reapers:
        reaper.start()
    time.sleep(1.0)
    release.set()
    for thread in (activity, *reapers):
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert not errors, errors

    # Between them the two runs reaped every idle sandbox, none twice, and not the busy one.
    assert len(results) == 2
    assert sorted(results[0] + results[1]) == sorted(idle)
    for sandbox_id in idle:
        sandbox = Sandbox.objects.get(pk=sandbox_id)
        assert sandbox.status == SandboxStatus.DESTROYED and sandbox.destroy_reason == "inactivity"
        events = AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.SANDBOX_DESTROY)
        assert [event.data["reason"] for event in events] == ["inactivity"]
        assert get_runtime().inspect(sandbox_id) is None, "processes and directory are gone"

    assert Sandbox.objects.get(pk=busy).status == SandboxStatus.RUNNING
    assert not AuditEvent.objects.filter(sandbox_id=busy, event_type=EventType.SANDBOX_DESTROY).exists()
    assert stdout_of(exec_lines(api, busy, "echo still-here")) == "still-here\n"
    # The reaped sandboxes' slots are free: this organization holds only the busy one.
    active = Sandbox.objects.filter(organization=enabled.organization, status__in=ACTIVE_STATUSES)
    assert list(active.values_list("pk", flat=True)) == [busy]
    listed = api.get("/api/v1/sandboxes").json()["results"]
    assert [item["id"] for item in listed] == [busy]
