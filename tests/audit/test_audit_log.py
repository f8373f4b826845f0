from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent, EventType
from audit.services import OutputCapture, record_event
from tests.conftest import Actor


def _seed(actor: Actor, sandbox_id: str, n: int) -> list[AuditEvent]:
    events = []
    for i in range(n):
        events.append(
            record_event(
                organization=actor.organization,
                event_type=EventType.EXEC if i % 2 else EventType.WRITE_FILE,
                sandbox_id=sandbox_id,
                user=actor.user,
                data={"i": i},
            )
        )
    return events


@pytest.mark.django_db
def test_newest_first_with_cursor_pages(owner: Actor) -> None:
    _seed(owner, "sbx_a", 7)
    client = owner.client()
    first = client.get("/api/v1/sandboxes/sbx_a/audit-logs?limit=3").json()
    assert [e["data"]["i"] for e in first["results"]] == [6, 5, 4]
    second = client.get(first["next"]).json()
    assert [e["data"]["i"] for e in second["results"]] == [3, 2, 1]
    event = first["results"][0]
    assert event["type"] == "sandbox.write_file"  # i=6 is even
    assert event["sandboxId"] == "sbx_a"
    assert event["actor"]["email"] == "owner@acme.test"


@pytest.mark.django_db
def test_filter_by_type_and_time(owner: Actor) -> None:
    _seed(owner, "sbx_a", 6)
    client = owner.client()
    execs = client.get("/api/v1/sandboxes/sbx_a/audit-logs?type=sandbox.exec").json()["results"]
    assert {e["type"] for e in execs} == {"sandbox.exec"} and len(execs) == 3
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert client.get("/api/v1/sandboxes/sbx_a/audit-logs", {"since": future}).json()["results"] == []
    assert len(client.get("/api/v1/sandboxes/sbx_a/audit-logs", {"until": future}).json()["results"]) == 6


@pytest.mark.django_db
def test_bad_filters_are_400(owner: Actor) -> None:
    _seed(owner, "sbx_a", 1)
    client = owner.client()
    response = client.get("/api/v1/sandboxes/sbx_a/audit-logs?type=nonsense")
    assert response.status_code == 400
    assert "type" in response.json()["error"]["details"]["fields"]
    response = client.get("/api/v1/sandboxes/sbx_a/audit-logs?since=yesterday")
    assert response.status_code == 400


@pytest.mark.django_db
def test_unknown_and_foreign_sandboxes_are_404(owner: Actor, teammate: Actor, outsider: Actor) -> None:
    _seed(owner, "sbx_a", 2)
    assert owner.client().get("/api/v1/sandboxes/sbx_missing/audit-logs").status_code == 404
    assert outsider.client().get("/api/v1/sandboxes/sbx_a/audit-logs").status_code == 404
    # Teammates in the same organization can read it.
    assert teammate.client().get("/api/v1/sandboxes/sbx_a/audit-logs").status_code == 200


@pytest.mark.django_db
def test_events_are_append_only(owner: Actor) -> None:
    event = _seed(owner, "sbx_a", 1)[0]
    event.data = {"tampered": True}
    with pytest.raises(ValueError):
        event.save()


@pytest.mark.django_db(transaction=True)
def test_concurrent_recording_loses_nothing(owner: Actor) -> None:
    def write(i: int) -> None:
        try:
            record_event(
                organization=owner.organization, event_type=EventType.EXEC, sandbox_id="sbx_busy", data={"i": i}
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, range(80)))
    values = sorted(e.data["i"] for e in AuditEvent.objects.filter(sandbox_id="sbx_busy"))
    assert values == list(range(80))


def test_output_capture_keeps_a_prefix_and_counts_all() -> None:
    capture = OutputCapture(cap=10)
    capture.add(b"hello ")
    capture.add(b"world, and more")
    assert capture.text() == "hello worl"
    assert capture.total == 21
    assert capture.truncated
    assert capture.as_dict("stdout") == {"stdout": "hello worl", "stdoutBytes": 21, "stdoutTruncated": True}
    small = OutputCapture(cap=100)
    small.add("héllo".encode())
    assert not small.truncated and small.text() == "héllo"
