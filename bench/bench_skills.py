"""Skills benchmark: a PUT with a 200 KB ``markdown``, and listing 1,000 skills.

Measured in-process with Django's test client against a throwaway database (a test database created
next to whatever DATABASE_URL points at, or a SQLite file in the run's own state directory), so the
figures are the service's own cost without network or server overhead. Reports p50 latency and
queries per request; every query count is also taken at 30 skills to show it does not grow with the
number of skills.

    .venv/bin/python -m bench skills
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

PUT_ROUNDS = 15
LIST_ROUNDS = 15
SKILLS = 1000
MARKDOWN_CHARS = 200 * 1024


def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings_test")
    import django

    django.setup()


def _p50_ms(action: Callable[[], Any], rounds: int) -> float:
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def _queries(action: Callable[[], Any]) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        action()
    return len(captured.captured_queries)


def _markdown(round_number: int) -> str:
    head = f"---\nname: big-skill\ndescription: A skill whose instructions are 200 KB (round {round_number}).\nlicense: MIT\n---\n\n"
    line = "- Step: do the thing carefully, then check the result twice.\n"
    body = (line * (MARKDOWN_CHARS // len(line) + 1))[: MARKDOWN_CHARS - len(head)]
    return head + body


def _measure() -> dict[str, float]:
    from django.test import Client

    from accounts import services as account_services
    from accounts.models import Role
    from skills.models import Skill, SkillCollection, Visibility

    membership = account_services.ensure_member(org_slug="bench", email="owner@bench.test", role=Role.OWNER)
    mate = account_services.ensure_member(org_slug="bench", email="mate@bench.test", role=Role.MEMBER)
    team = account_services.create_team(organization=membership.organization, name="Bench team", members=[mate.user])
    issued = account_services.create_token(user=mate.user, organization=mate.organization)
    client = Client(headers={"Authorization": f"Bearer {issued.raw}"})
    client.get("/api/v1/me")  # the token's last-use write happens here, not inside a measurement

    collection = SkillCollection.objects.create(
        organization=membership.organization, name="everything", created_by=membership.user
    )
    collection.maintainer_users.set([mate.user])
    collection.shared_with_teams.set([team])

    def add_skills(upto: int) -> None:
        for index in range(Skill.objects.count(), upto):
            skill = Skill.objects.create(
                organization=membership.organization,
                name=f"skill-{index}",
                description=f"Use for task number {index}.",
                content=f"# Skill {index}\n\nInstructions.\n",
                visibility=Visibility.PRIVATE if index % 2 else Visibility.ORGANIZATION,
                collection=collection,
                created_by=membership.user,
            )
            skill.shared_with_users.set([mate.user])
            skill.maintainer_teams.set([team])

    def list_page() -> None:
        response = client.get("/api/v1/skills?limit=200")
        assert response.status_code == 200, response.content[:300]

    def collection_listing() -> None:
        response = client.get(f"/api/v1/skill-collections/{collection.pk}/skills")
        assert response.status_code == 200, response.content[:300]

    add_skills(30)
    target = Skill.objects.get(name="skill-0")
    rounds = iter(range(10**6))

    def put() -> None:
        response = client.put(
            f"/api/v1/skills/{target.pk}", {"markdown": _markdown(next(rounds))}, content_type="application/json"
        )
        assert response.status_code == 200, response.content[:300]

    put()  # warm-up: the first request loads templates, serializers and the like
    put_queries_30 = _queries(put)
    list_queries_30 = _queries(list_page)
    listing_queries_30 = _queries(collection_listing)
    add_skills(SKILLS)
    assert len(client.get("/api/v1/skills?limit=200").json()["results"]) == 200
    assert len(client.get(f"/api/v1/skill-collections/{collection.pk}/skills").json()["results"]) == SKILLS

    results = {
        "put_200kb_markdown_p50_ms": _p50_ms(put, PUT_ROUNDS),
        "put_200kb_markdown_queries": float(_queries(put)),
        "put_queries_at_30_skills": float(put_queries_30),
        "list_200_of_1000_p50_ms": _p50_ms(list_page, LIST_ROUNDS),
        "list_200_of_1000_queries": float(_queries(list_page)),
        "list_queries_at_30_skills": float(list_queries_30),
        "collection_listing_1000_p50_ms": _p50_ms(collection_listing, LIST_ROUNDS),
        "collection_listing_1000_queries": float(_queries(collection_listing)),
        "collection_listing_queries_at_30_skills": float(listing_queries_30),
    }
    return results


def run() -> dict[str, float]:
    _django()
    from django.test.utils import (
        setup_databases,
        setup_test_environment,
        teardown_databases,
        teardown_test_environment,
    )

    # Another benchmark in the same process may have set the test environment up already.
    owns_environment = True
    try:
        setup_test_environment()
    except RuntimeError:
        owns_environment = False
    old_config = setup_databases(verbosity=0, interactive=False, aliases={"default": {}})
    try:
        results = _measure()
    finally:
        teardown_databases(old_config, verbosity=0)
        if owns_environment:
            teardown_test_environment()
    for key, value in results.items():
        print(f"{key:42s} {value:10.2f}")
    return results


if __name__ == "__main__":
    run()
