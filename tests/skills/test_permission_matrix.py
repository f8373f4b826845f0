"""The permission table in docs/skills.md, checked cell by cell through the API.

The cases are read from the document, so the documented rule and the code cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from accounts import services as account_services
from accounts.models import Role
from skills.models import Skill, SkillCollection, Visibility
from tests.conftest import Actor, make_actor
from tests.skills.conftest import api

DOC = Path(settings.BASE_DIR) / "docs" / "skills.md"


@dataclass(frozen=True)
class Column:
    visibility: str
    placement: str  # "root", "organization" or "private" (the collection's visibility)


def _read_table() -> tuple[list[Column], dict[str, list[str]]]:
    text = DOC.read_text()
    block = text.split("<!-- permission-matrix:start -->")[1].split("<!-- permission-matrix:end -->")[0]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in block.strip().splitlines()
        if line.startswith("|")
    ]
    header, _rule, *body = rows
    columns = []
    for title in header[1:]:
        skill_part, place_part = (part.strip() for part in title.split(","))
        visibility = {"org skill": Visibility.ORGANIZATION, "private skill": Visibility.PRIVATE}[skill_part]
        placement = {"root": "root", "org collection": "organization", "private collection": "private"}[place_part]
        columns.append(Column(visibility=visibility, placement=placement))
    return columns, {row[0]: row[1:] for row in body}


COLUMNS, TABLE = _read_table()
ROLES = [
    "creator",
    "shared user",
    "member of shared team",
    "maintainer",
    "collection maintainer",
    "plain member",
    "admin",
    "outsider org",
]


def test_the_table_covers_every_role_and_column() -> None:
    assert sorted(TABLE) == sorted(ROLES)
    assert len(COLUMNS) == 6
    assert all(len(cells) == 6 and set(cells) <= {"edit", "read", "-"} for cells in TABLE.values())


@pytest.mark.django_db
@pytest.mark.parametrize("index", range(len(COLUMNS)), ids=[f"{c.visibility}-{c.placement}" for c in COLUMNS])
def test_permission_matrix(index: int) -> None:
    column = COLUMNS[index]
    actors: dict[str, Actor] = {
        "creator": make_actor("acme", "creator@acme.test", Role.MEMBER),
        "shared user": make_actor("acme", "shared@acme.test", Role.MEMBER),
        "member of shared team": make_actor("acme", "teamie@acme.test", Role.MEMBER),
        "maintainer": make_actor("acme", "maintainer@acme.test", Role.MEMBER),
        "collection maintainer": make_actor("acme", "curator@acme.test", Role.MEMBER),
        "plain member": make_actor("acme", "plain@acme.test", Role.MEMBER),
        "admin": make_actor("acme", "admin@acme.test", Role.ADMIN),
        "outsider org": make_actor("globex", "owner@globex.test", Role.OWNER),
    }
    creator = actors["creator"]
    team = account_services.create_team(
        organization=creator.organization, name="Readers", members=[actors["member of shared team"].user]
    )
    collection_id = None
    if column.placement != "root":
        response = api(
            creator.client(),
            "post",
            "/api/v1/skill-collections",
            {
                "name": "the-collection",
                "visibility": column.placement,
                "maintainerUserIds": [actors["collection maintainer"].user.pk],
            },
        )
        assert response.status_code == 201, response.content
        collection_id = response.json()["id"]
    response = api(
        creator.client(),
        "post",
        "/api/v1/skills",
        {
            "name": "the-skill",
            "description": "Original.",
            "content": "Body.",
            "visibility": column.visibility,
            "collectionId": collection_id,
            "sharedWithUserIds": [actors["shared user"].user.pk],
            "sharedWithTeamIds": [team.pk],
            "maintainerUserIds": [actors["maintainer"].user.pk],
        },
    )
    assert response.status_code == 201, response.content
    skill_id = response.json()["id"]

    mismatches = []
    for role in ROLES:
        expected = TABLE[role][index]
        client = actors[role].client()
        read = client.get(f"/api/v1/skills/{skill_id}").status_code
        listed = skill_id in [s["id"] for s in client.get("/api/v1/skills").json()["results"]]
        markdown = client.get(f"/api/v1/skills/{skill_id}/skill.md").status_code
        edit = api(client, "put", f"/api/v1/skills/{skill_id}", {"description": f"Edited by {role}."}).status_code
        want_read = 404 if expected == "-" else 200
        want_edit = {"edit": 200, "read": 403, "-": 404}[expected]
        if (read, markdown, listed, edit) != (want_read, want_read, expected != "-", want_edit):
            mismatches.append((role, expected, read, markdown, listed, edit))
        stored = Skill.objects.get(pk=skill_id).description
        assert (stored == f"Edited by {role}.") == (expected == "edit"), (role, stored)
    assert mismatches == []
    if collection_id:
        assert SkillCollection.objects.filter(pk=collection_id).exists()
