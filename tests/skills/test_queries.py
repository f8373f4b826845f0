"""Query counts do not grow with the number of skills (no N+1 anywhere a list is rendered)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.models import Team
from skills.models import Skill, SkillCollection, Visibility
from tests.conftest import Actor

pytestmark = pytest.mark.django_db


def _populate(owner: Actor, teammate: Actor, team: Team, count: int) -> SkillCollection:
    collection, _ = SkillCollection.objects.get_or_create(
        organization=owner.organization, name="bulk", defaults={"created_by": owner.user}
    )
    collection.maintainer_users.set([teammate.user])
    collection.shared_with_teams.set([team])
    start = Skill.objects.filter(organization=owner.organization).count()
    for index in range(start, count):
        skill = Skill.objects.create(
            organization=owner.organization,
            name=f"skill-{index}",
            description="d",
            content="c" * index,
            visibility=Visibility.PRIVATE if index % 2 else Visibility.ORGANIZATION,
            collection=None if index % 3 == 2 else collection,
            created_by=owner.user,
        )
        skill.shared_with_users.set([teammate.user])
        skill.maintainer_teams.set([team])
    return collection


def _count(request: Callable[[], object]) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = request()
    assert getattr(response, "status_code", None) == 200
    return len(captured.captured_queries)


def test_lists_use_a_constant_number_of_queries(owner: Actor, teammate: Actor, team: Team) -> None:
    client: Client = teammate.client()
    client.get("/api/v1/me")  # token last-use bookkeeping happens once a minute; keep it out of the counts
    collection = _populate(owner, teammate, team, 1)
    requests = {
        "skills": lambda: client.get("/api/v1/skills?limit=200"),
        "collections": lambda: client.get("/api/v1/skill-collections"),
        "collection skills": lambda: client.get(f"/api/v1/skill-collections/{collection.pk}/skills"),
    }
    small = {name: _count(request) for name, request in requests.items()}
    _populate(owner, teammate, team, 30)
    large = {name: _count(request) for name, request in requests.items()}
    assert small == large
    # And the numbers themselves stay small: auth, the rows, one per relation prefetched.
    assert large["skills"] <= 12, large
    # Everything was visible to the teammate (shared), so the lists really held 30 skills.
    assert len(client.get("/api/v1/skills?limit=200").json()["results"]) == 30


def test_an_update_uses_a_constant_number_of_queries(owner: Actor, teammate: Actor, team: Team) -> None:
    client: Client = teammate.client()
    client.get("/api/v1/me")
    _populate(owner, teammate, team, 1)
    # skill-0 is organization-visible in the collection the teammate maintains: theirs to edit.
    target = Skill.objects.get(organization=owner.organization, name="skill-0")
    rounds = iter(range(1000))

    def put() -> object:
        markdown = f"---\nname: skill-0\ndescription: Round {next(rounds)}.\n---\n\n# Steps\n\nDo it.\n"
        return client.put(f"/api/v1/skills/{target.pk}", {"markdown": markdown}, content_type="application/json")

    put()  # the first request warms per-process caches
    small = _count(put)
    _populate(owner, teammate, team, 30)
    assert _count(put) == small
