"""Concurrent creates of one name: the database constraint leaves exactly one, the rest get 409."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction

from skills.models import Skill, SkillCollection
from tests.conftest import Actor
from tests.skills.conftest import api

WORKERS = 6


def _race(actor: Actor, path: str, body: dict[str, Any]) -> list[int]:
    barrier = threading.Barrier(WORKERS)
    statuses: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            client = actor.client()
            barrier.wait()
            status = api(client, "post", path, body).status_code
            with lock:
                statuses.append(status)
        finally:
            # Each thread has its own connection; leaving it open would block dropping the test database.
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return statuses


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_of_one_name_make_exactly_one(owner: Actor) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serializes writers; the race is exercised on PostgreSQL (CI sets DATABASE_URL)")
    statuses = _race(owner, "/api/v1/skills", {"name": "same", "description": "d", "content": "c"})
    assert sorted(statuses) == [201] + [409] * (WORKERS - 1)
    assert Skill.objects.filter(name="same").count() == 1

    statuses = _race(owner, "/api/v1/skill-collections", {"name": "same"})
    assert sorted(statuses) == [201] + [409] * (WORKERS - 1)
    assert SkillCollection.objects.filter(name="same").count() == 1


@pytest.mark.django_db
def test_the_database_itself_refuses_a_duplicate_name(owner: Actor) -> None:
    """The check in the service is only a shortcut; this is what makes the race above safe."""
    Skill.objects.create(organization=owner.organization, name="dup", description="d", content="c")
    with pytest.raises(IntegrityError), transaction.atomic():
        Skill.objects.create(organization=owner.organization, name="dup", description="d", content="c")
    SkillCollection.objects.create(organization=owner.organization, name="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        SkillCollection.objects.create(organization=owner.organization, name="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        Skill.objects.create(organization=owner.organization, name="Not Valid", description="d", content="c")
