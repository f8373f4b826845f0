from __future__ import annotations

import pytest
from django.test import Client

from accounts import services as account_services
from accounts.models import Team
from skills import skillmd
from skills.models import Skill, SkillCollection
from tests.conftest import Actor
from tests.skills.conftest import SKILL_MD, api, create_collection, create_skill

pytestmark = pytest.mark.django_db

SKILL_FIELDS = {
    "id", "name", "description", "visibility", "collectionId", "collectionName", "contentBytes",
    "createdByUserId", "createdByUserName", "createdByUserEmail", "sharedWithUserIds", "sharedWithTeamIds",
    "maintainerUserIds", "maintainerTeamIds", "collectionVisibility", "collectionSharedWithUserIds",
    "collectionSharedWithTeamIds", "collectionMaintainerUserIds", "collectionMaintainerTeamIds",
    "createdAt", "updatedAt",
}  # fmt: skip
COLLECTION_FIELDS = {
    "id", "name", "description", "visibility", "createdByUserId", "createdByUserName", "createdByUserEmail",
    "sharedWithUserIds", "sharedWithTeamIds", "maintainerUserIds", "maintainerTeamIds", "skillCount",
    "createdAt", "updatedAt",
}  # fmt: skip


def test_create_from_markdown_exposes_every_seed_field(owner: Actor, teammate: Actor, team: Team) -> None:
    owner.user.name = "Olivia Owner"
    owner.user.save()
    collection = create_collection(owner, visibility="private", sharedWithTeamIds=[team.pk])
    response = api(
        owner.client(),
        "post",
        "/api/v1/skills",
        {
            "markdown": SKILL_MD,
            "visibility": "private",
            "collectionId": collection["id"],
            "sharedWithUserIds": [teammate.user.pk],
            "maintainerTeamIds": [team.pk],
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert SKILL_FIELDS <= set(body)
    assert body["id"].startswith("skl_")
    assert body["name"] == "pdf-tools"
    assert body["description"] == "Use when the user asks to read, fill or merge PDF files."
    assert body["visibility"] == "private"
    assert body["collectionId"] == collection["id"]
    assert body["collectionName"] == "a-collection"
    assert body["collectionVisibility"] == "private"
    assert body["collectionSharedWithTeamIds"] == [team.pk]
    assert body["collectionSharedWithUserIds"] == []
    assert body["createdByUserId"] == owner.user.pk
    assert body["createdByUserName"] == "Olivia Owner"
    assert body["createdByUserEmail"] == "owner@acme.test"
    assert body["sharedWithUserIds"] == [teammate.user.pk]
    assert body["maintainerTeamIds"] == [team.pk]
    assert body["content"].startswith("# PDF tools\n")
    assert body["contentBytes"] == len(body["content"].encode())
    assert body["frontmatter"]["metadata"] == {"author": "acme", "version": "1.2"}
    assert body["frontmatter"]["x-custom-flag"] is True

    listed = api(owner.client(), "get", "/api/v1/skills").json()["results"]
    assert [item["id"] for item in listed] == [body["id"]]
    assert SKILL_FIELDS <= set(listed[0])
    assert "content" not in listed[0]


def test_skill_md_round_trip_keeps_optional_and_unknown_fields(owner: Actor) -> None:
    skill = api(owner.client(), "post", "/api/v1/skills", {"markdown": SKILL_MD}).json()
    response = owner.client().get(f"/api/v1/skills/{skill['id']}/skill.md")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    text = response.content.decode()
    assert skillmd.parse_skill_md(text) == skillmd.parse_skill_md(SKILL_MD)
    for line in ("license: Apache-2.0", "allowed-tools: Bash(pdftotext:*) Read", "x-custom-flag: true"):
        assert line in text
    # Keys keep their document order (stored as JSON text, not reordering jsonb).
    assert text.index("license") < text.index("compatibility") < text.index("metadata") < text.index("x-custom")

    # Changing only the description through the plain fields keeps every other frontmatter field.
    api(owner.client(), "put", f"/api/v1/skills/{skill['id']}", {"description": "Use for PDFs."})
    again = skillmd.parse_skill_md(owner.client().get(f"/api/v1/skills/{skill['id']}/skill.md").content.decode())
    assert again.description == "Use for PDFs."
    assert again.extra == skillmd.parse_skill_md(SKILL_MD).extra


def test_put_seed_contract(owner: Actor) -> None:
    skill = create_skill(owner)
    client = owner.client()
    response = api(client, "put", f"/api/v1/skills/{skill['id']}", {"name": "renamed", "content": "New\r\nbody"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["name"] == "renamed"
    assert body["content"] == "New\nbody"
    assert body["description"] == "Use for tests."
    assert SKILL_FIELDS <= set(body)

    md = "\ufeff---\r\nname: from-md\r\ndescription: d\r\n---\r\n\r\nBody\r\n"
    body = api(client, "put", f"/api/v1/skills/{skill['id']}", {"markdown": md}).json()
    assert (body["name"], body["description"], body["content"]) == ("from-md", "d", "Body\n")

    both = api(client, "put", f"/api/v1/skills/{skill['id']}", {"markdown": md, "content": "x"})
    assert both.status_code == 400
    assert "markdown" in both.json()["error"]["details"]["fields"]

    unknown = api(client, "put", f"/api/v1/skills/{skill['id']}", {"nmae": "typo"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["details"]["fields"] == {"nmae": ["Unknown field."]}

    for bad, field in [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "a" * 65}, "name"),
        ({"name": "-a"}, "name"),
        ({"name": "a--b"}, "name"),
        ({"description": ""}, "description"),
        ({"description": "x" * 1025}, "description"),
        ({"content": ""}, "content"),
        ({"content": "x" * 204_801}, "content"),
        ({"visibility": "public"}, "visibility"),
        ({"content": "lone \ud800 surrogate"}, "content"),
        ({"description": "nul \x00 char"}, "description"),
        ({"collectionId": "skc_nope"}, "collectionId"),
        ({"sharedWithUserIds": ["usr_nope"]}, "sharedWithUserIds"),
        ({"maintainerTeamIds": ["team_nope"]}, "maintainerTeamIds"),
        ({"markdown": "no frontmatter"}, "markdown"),
        ({"markdown": "x" * 204_801}, "markdown"),
    ]:
        response = api(client, "put", f"/api/v1/skills/{skill['id']}", bad)
        assert response.status_code == 400, (bad, response.content)
        error = response.json()["error"]
        assert error["code"] == "validation_error"
        assert field in error["details"]["fields"], (bad, error)
    assert Skill.objects.get(pk=skill["id"]).name == "from-md"


def test_markdown_errors_name_the_frontmatter_field(owner: Actor) -> None:
    skill = create_skill(owner)
    for markdown, field in [
        ("---\nname: 123\ndescription: d\n---\nb", "name"),
        ("---\nname: a\ndescription: yes\n---\nb", "description"),
        ("---\nname: a\ndescription: d\ncompatibility: " + "x" * 501 + "\n---\nb", "compatibility"),
        ("---\nname: a\ndescription: d\nmetadata: {a: 1}\n---\nb", "metadata"),
        ("---\nname: a\ndescription: d\nallowed-tools: [a, b]\n---\nb", "allowed-tools"),
        ("---\ndescription: d\n---\nb", "name"),
    ]:
        response = api(owner.client(), "put", f"/api/v1/skills/{skill['id']}", {"markdown": markdown})
        assert response.status_code == 400, markdown
        error = response.json()["error"]
        assert error["details"]["frontmatterField"] == field
        assert f"{field}" in error["details"]["fields"]["markdown"][0]


def test_yaml_bombs_and_duplicates_are_refused(owner: Actor) -> None:
    bomb = "---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nname: a\ndescription: d\n---\nbody"
    duplicate = "---\nname: a\ndescription: d\nname: b\n---\nbody"
    huge = "---\nname: a\ndescription: d\nx: " + "y" * (skillmd.FRONTMATTER_MAX + 10) + "\n---\nbody"
    for markdown, words in [(bomb, "anchors"), (duplicate, "duplicate key 'name'"), (huge, "at most")]:
        response = api(owner.client(), "post", "/api/v1/skills", {"markdown": markdown})
        assert response.status_code == 400
        assert words in response.json()["error"]["details"]["fields"]["markdown"][0]
    assert Skill.objects.count() == 0


def test_create_requires_the_document(owner: Actor) -> None:
    response = api(owner.client(), "post", "/api/v1/skills", {"name": "x"})
    assert response.status_code == 400
    assert {"description", "content"} <= set(response.json()["error"]["details"]["fields"])


def test_names_are_unique_per_organization(owner: Actor, outsider: Actor) -> None:
    create_skill(owner, name="dup")
    response = api(owner.client(), "post", "/api/v1/skills", {"name": "dup", "description": "d", "content": "c"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "name_taken"
    # Another organization may use the same name.
    create_skill(outsider, name="dup")
    other = create_skill(owner, name="other")
    rename = api(owner.client(), "put", f"/api/v1/skills/{other['id']}", {"name": "dup"})
    assert rename.status_code == 409

    create_collection(owner, name="tools")
    again = api(owner.client(), "post", "/api/v1/skill-collections", {"name": "tools"})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "name_taken"
    # Skills and collections have separate name spaces.
    create_collection(owner, name="dup")


def test_other_organization_gets_404_everywhere(owner: Actor, outsider: Actor) -> None:
    collection = create_collection(owner)
    skill = create_skill(owner, collectionId=collection["id"])
    client = outsider.client()
    for method, path in [
        ("get", f"/api/v1/skills/{skill['id']}"),
        ("put", f"/api/v1/skills/{skill['id']}"),
        ("delete", f"/api/v1/skills/{skill['id']}"),
        ("get", f"/api/v1/skills/{skill['id']}/skill.md"),
        ("get", f"/api/v1/skills/by-name/{skill['name']}"),
        ("get", f"/api/v1/skill-collections/{collection['id']}"),
        ("put", f"/api/v1/skill-collections/{collection['id']}"),
        ("delete", f"/api/v1/skill-collections/{collection['id']}"),
        ("get", f"/api/v1/skill-collections/{collection['id']}/skills"),
        ("get", f"/api/v1/skill-collections/by-name/{collection['name']}"),
    ]:
        response = api(client, method, path, {"description": "x"} if method == "put" else None)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "not_found"
    assert api(client, "get", "/api/v1/skills").json()["results"] == []
    assert api(client, "get", "/api/v1/skill-collections").json()["results"] == []
    # Moving one's own skill into another organization's collection is "no such collection".
    mine = create_skill(outsider, name="mine")
    response = api(client, "put", f"/api/v1/skills/{mine['id']}", {"collectionId": collection["id"]})
    assert response.status_code == 400
    assert response.json()["error"]["details"]["fields"]["collectionId"]


def test_read_only_token_reads_but_cannot_write(owner: Actor) -> None:
    collection = create_collection(owner)
    skill = create_skill(owner, collectionId=collection["id"])
    issued = account_services.create_token(user=owner.user, organization=owner.organization, read_only=True)
    client = Client(headers={"Authorization": f"Bearer {issued.raw}"})
    assert client.get(f"/api/v1/skills/{skill['id']}").status_code == 200
    assert client.get(f"/api/v1/skills/{skill['id']}/skill.md").status_code == 200
    assert client.get(f"/api/v1/skill-collections/{collection['id']}/skills").status_code == 200
    for method, path, body in [
        ("post", "/api/v1/skills", {"name": "x", "description": "d", "content": "c"}),
        ("put", f"/api/v1/skills/{skill['id']}", {"description": "changed"}),
        ("delete", f"/api/v1/skills/{skill['id']}", None),
        ("post", "/api/v1/skill-collections", {"name": "y"}),
        ("put", f"/api/v1/skill-collections/{collection['id']}", {"description": "changed"}),
        ("delete", f"/api/v1/skill-collections/{collection['id']}", None),
    ]:
        response = api(client, method, path, body)
        assert response.status_code == 403, (method, path)
        assert response.json()["error"]["code"] == "read_only_token"
    assert Skill.objects.get(pk=skill["id"]).description == "Use for tests."
    assert SkillCollection.objects.get(pk=collection["id"]).description == "Things."
    assert Skill.objects.count() == 1 and SkillCollection.objects.count() == 1


def test_skill_md_etag_and_304(owner: Actor) -> None:
    skill = create_skill(owner)
    client = owner.client()
    path = f"/api/v1/skills/{skill['id']}/skill.md"
    first = client.get(path)
    etag = first["ETag"]
    assert etag.startswith('"') and etag.strip('"') == skill["etag"]
    unchanged = client.get(path, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304
    assert unchanged.content == b""
    assert client.get(path, headers={"If-None-Match": f"W/{etag}"}).status_code == 304
    assert client.get(path, headers={"If-None-Match": '"other"'}).status_code == 200

    api(client, "put", f"/api/v1/skills/{skill['id']}", {"content": "Changed."})
    changed = client.get(path, headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed["ETag"] != etag
    assert changed.content.decode().endswith("\n\nChanged.")
    # Sharing does not change the document, so the document's ETag stays.
    api(client, "put", f"/api/v1/skills/{skill['id']}", {"visibility": "private"})
    assert client.get(path, headers={"If-None-Match": changed["ETag"]}).status_code == 304


def test_collection_listing_etag_follows_any_change(owner: Actor, teammate: Actor) -> None:
    collection = create_collection(owner)
    a = create_skill(owner, name="a", collectionId=collection["id"])
    create_skill(owner, name="b", collectionId=collection["id"])
    create_skill(owner, name="elsewhere")
    client = owner.client()
    path = f"/api/v1/skill-collections/{collection['id']}/skills"
    first = client.get(path)
    assert first.status_code == 200
    body = first.json()
    assert body["collection"]["id"] == collection["id"]
    assert body["collection"]["skillCount"] == 2
    assert [item["name"] for item in body["results"]] == ["a", "b"]
    etag = first["ETag"]
    assert client.get(path, headers={"If-None-Match": etag}).status_code == 304

    # A change to one skill's content, then to its sharing, each change the listing's ETag.
    api(client, "put", f"/api/v1/skills/{a['id']}", {"content": "new"})
    second = client.get(path, headers={"If-None-Match": etag})
    assert second.status_code == 200
    api(client, "put", f"/api/v1/skills/{a['id']}", {"sharedWithUserIds": [teammate.user.pk]})
    third = client.get(path, headers={"If-None-Match": second["ETag"]})
    assert third.status_code == 200
    assert len({etag, second["ETag"], third["ETag"]}) == 3


def test_by_name_lookups(owner: Actor, teammate: Actor) -> None:
    collection = create_collection(owner, name="team-tools", visibility="private")
    skill = create_skill(owner, name="deploy", visibility="private")
    response = owner.client().get("/api/v1/skill-collections/by-name/team-tools")
    assert response.status_code == 200
    assert response.json()["id"] == collection["id"]
    assert COLLECTION_FIELDS <= set(response.json())
    assert owner.client().get("/api/v1/skills/by-name/deploy").json()["id"] == skill["id"]
    # Private and not shared: the teammate cannot tell it exists.
    assert teammate.client().get("/api/v1/skill-collections/by-name/team-tools").status_code == 404
    assert teammate.client().get("/api/v1/skills/by-name/deploy").status_code == 404
    assert owner.client().get("/api/v1/skill-collections/by-name/nothing").status_code == 404


def test_collection_crud_and_delete_policy(owner: Actor, teammate: Actor, team: Team) -> None:
    collection = create_collection(owner, maintainerUserIds=[teammate.user.pk])
    assert COLLECTION_FIELDS <= set(collection)
    assert collection["skillCount"] == 0
    assert collection["maintainerUserIds"] == [teammate.user.pk]
    response = api(
        teammate.client(),
        "put",
        f"/api/v1/skill-collections/{collection['id']}",
        {"name": "renamed", "description": "", "visibility": "private", "sharedWithTeamIds": [team.pk]},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["description"], body["visibility"]) == ("renamed", "", "private")
    assert body["sharedWithTeamIds"] == [team.pk]
    assert (
        api(owner.client(), "put", f"/api/v1/skill-collections/{collection['id']}", {"name": "Bad"}).status_code == 400
    )

    skill = create_skill(owner, collectionId=collection["id"])
    refused = owner.client().delete(f"/api/v1/skill-collections/{collection['id']}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "collection_not_empty"
    assert refused.json()["error"]["details"]["skillCount"] == 1
    api(owner.client(), "put", f"/api/v1/skills/{skill['id']}", {"collectionId": None})
    assert Skill.objects.get(pk=skill["id"]).collection_id is None
    assert owner.client().delete(f"/api/v1/skill-collections/{collection['id']}").status_code == 204
    assert not SkillCollection.objects.filter(pk=collection["id"]).exists()


def test_plain_member_cannot_edit_others_collection(owner: Actor, teammate: Actor) -> None:
    collection = create_collection(owner)
    response = api(teammate.client(), "put", f"/api/v1/skill-collections/{collection['id']}", {"description": "x"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert teammate.client().delete(f"/api/v1/skill-collections/{collection['id']}").status_code == 403
    assert SkillCollection.objects.get(pk=collection["id"]).description == "Things."


def test_list_filters_and_cursor_pagination(owner: Actor) -> None:
    collection = create_collection(owner)
    for index in range(5):
        create_skill(owner, name=f"skill-{index}", collectionId=collection["id"] if index % 2 else None)
    create_skill(owner, name="secret-thing", description="Hidden helper", visibility="private")
    client = owner.client()

    def names(query: str) -> list[str]:
        return [item["name"] for item in client.get(f"/api/v1/skills?{query}").json()["results"]]

    assert names(f"collectionId={collection['id']}") == ["skill-3", "skill-1"]
    assert names("collectionId=root") == ["secret-thing", "skill-4", "skill-2", "skill-0"]
    assert names("visibility=private") == ["secret-thing"]
    assert names("q=HIDDEN") == ["secret-thing"]
    assert client.get("/api/v1/skills?visibility=public").status_code == 400

    seen: list[str] = []
    url: str | None = "/api/v1/skills?limit=2"
    while url:
        page = client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [item["name"] for item in page["results"]]
        url = page["next"]
    assert len(seen) == 6 and len(set(seen)) == 6

    collections = client.get("/api/v1/skill-collections?q=a-coll").json()["results"]
    assert [c["skillCount"] for c in collections] == [2]


def test_delete_skill(owner: Actor, teammate: Actor) -> None:
    skill = create_skill(owner)
    assert teammate.client().delete(f"/api/v1/skills/{skill['id']}").status_code == 403
    assert owner.client().delete(f"/api/v1/skills/{skill['id']}").status_code == 204
    assert owner.client().get(f"/api/v1/skills/{skill['id']}").status_code == 404


def test_admin_edit_that_hides_the_skill_still_answers_the_object(owner: Actor, admin_actor: Actor) -> None:
    skill = create_skill(owner)
    response = api(admin_actor.client(), "put", f"/api/v1/skills/{skill['id']}", {"visibility": "private"})
    assert response.status_code == 200
    assert response.json()["visibility"] == "private"
    assert admin_actor.client().get(f"/api/v1/skills/{skill['id']}").status_code == 404


def test_deleting_the_organization_removes_its_skills(owner: Actor) -> None:
    collection = create_collection(owner)
    create_skill(owner, collectionId=collection["id"])
    owner.organization.delete()
    assert Skill.objects.count() == 0 and SkillCollection.objects.count() == 0


def test_schema_documents_the_skill_endpoints(owner: Actor) -> None:
    schema = owner.client().get("/api/v1/schema", headers={"Accept": "application/json"})
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ("/api/v1/skills/{skill_id}", "/api/v1/skill-collections/by-name/{name}", "skill.md"):
        assert path in text
