from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import Team
from skills.models import Skill, SkillCollection
from skills.views import render_markdown
from tests.conftest import Actor
from tests.skills.conftest import SKILL_MD, create_collection, create_skill

pytestmark = pytest.mark.django_db


def browser_for(actor: Actor) -> Client:
    browser = Client()
    assert browser.post("/login/", {"token": actor.token}).status_code == 302
    return browser


def test_pages_need_login(anon: Client) -> None:
    for path in ("/skills/", "/collections/", "/skills/new/"):
        response = anon.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


def test_navigation_shows_skills_and_collections(owner: Actor) -> None:
    home = browser_for(owner).get("/")
    assert b'href="/skills/"' in home.content
    assert b'href="/collections/"' in home.content


def test_list_with_filters_hides_unreadable(owner: Actor, teammate: Actor) -> None:
    collection = create_collection(owner, name="ops")
    create_skill(owner, name="deploy-app", collectionId=collection["id"])
    create_skill(owner, name="write-docs", description="Docs writing")
    create_skill(owner, name="owner-secret", visibility="private")
    browser = browser_for(teammate)
    page = browser.get("/skills/").content.decode()
    assert "deploy-app" in page and "write-docs" in page
    assert "owner-secret" not in page
    filtered = browser.get(f"/skills/?collection={collection['id']}").content.decode()
    assert "deploy-app" in filtered and "write-docs" not in filtered
    text = browser.get("/skills/?q=docs").content.decode()
    assert "write-docs" in text and "deploy-app" not in text
    assert "ops" in browser.get("/collections/").content.decode()


def test_create_by_form_with_sharing_then_view(owner: Actor, teammate: Actor, team: Team) -> None:
    browser = browser_for(owner)
    assert browser.get("/skills/new/").status_code == 200
    response = browser.post(
        "/skills/new/",
        {
            "mode": "fields",
            "name": "from-form",
            "description": "Made in the dashboard.",
            "content": "# Hello\r\n\r\nWorld <script>alert(1)</script> [x](javascript:alert(2))\r\n",
            "visibility": "private",
            "collection": "",
            "shared_with_users": [teammate.user.pk],
            "maintainer_teams": [team.pk],
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    skill = Skill.objects.get(name="from-form")
    assert skill.visibility == "private"
    assert [u.pk for u in skill.shared_with_users.all()] == [teammate.user.pk]
    assert [t.pk for t in skill.maintainer_teams.all()] == [team.pk]
    assert skill.content == "# Hello\n\nWorld <script>alert(1)</script> [x](javascript:alert(2))\n"

    page = browser.get(f"/skills/{skill.pk}/").content.decode()
    rendered = page.split('id="rendered">')[1].split("</article>")[0]
    assert "<h1>Hello</h1>" in rendered
    assert "<script" not in rendered and "javascript:" not in rendered
    # The teammate is in the maintaining team, so the page offers editing.
    shared_view = browser_for(teammate).get(f"/skills/{skill.pk}/").content.decode()
    assert "from-form" in shared_view
    assert f"/skills/{skill.pk}/edit/" in shared_view
    # Shared with someone who does not maintain it: readable, no edit link.
    skill.maintainer_teams.clear()
    read_only_view = browser_for(teammate).get(f"/skills/{skill.pk}/").content.decode()
    assert "from-form" in read_only_view
    assert f"/skills/{skill.pk}/edit/" not in read_only_view


def test_create_and_edit_by_raw_skill_md(owner: Actor) -> None:
    browser = browser_for(owner)
    assert browser.get("/skills/new/?mode=raw").status_code == 200
    response = browser.post(
        "/skills/new/", {"mode": "raw", "markdown": SKILL_MD, "visibility": "organization", "collection": ""}
    )
    assert response.status_code == 302
    skill = Skill.objects.get(name="pdf-tools")
    assert skill.extra["license"] == "Apache-2.0"

    edit_page = browser.get(f"/skills/{skill.pk}/edit/?mode=raw").content.decode()
    assert "license: Apache-2.0" in edit_page
    bad = browser.post(
        f"/skills/{skill.pk}/edit/",
        {"mode": "raw", "markdown": "---\nname: 123\ndescription: d\n---\nbody", "visibility": "organization"},
    )
    assert bad.status_code == 200
    assert "must be a string" in bad.content.decode()
    assert Skill.objects.get(pk=skill.pk).name == "pdf-tools"

    new_md = SKILL_MD.replace("name: pdf-tools", "name: pdf-kit")
    ok = browser.post(f"/skills/{skill.pk}/edit/", {"mode": "raw", "markdown": new_md, "visibility": "private"})
    assert ok.status_code == 302
    skill.refresh_from_db()
    assert (skill.name, skill.visibility) == ("pdf-kit", "private")


def test_edit_by_form_reports_name_taken(owner: Actor) -> None:
    create_skill(owner, name="taken")
    other = create_skill(owner, name="other")
    browser = browser_for(owner)
    response = browser.post(
        f"/skills/{other['id']}/edit/",
        {"mode": "fields", "name": "taken", "description": "d", "content": "c", "visibility": "organization"},
    )
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert Skill.objects.get(pk=other["id"]).name == "other"


def test_delete_respects_permissions(owner: Actor, teammate: Actor) -> None:
    skill = create_skill(owner)
    mate = browser_for(teammate)
    mate.post(f"/skills/{skill['id']}/delete/")
    assert Skill.objects.filter(pk=skill["id"]).exists()
    assert mate.get(f"/skills/{skill['id']}/edit/").status_code == 302
    owner_browser = browser_for(owner)
    assert owner_browser.post(f"/skills/{skill['id']}/delete/").status_code == 302
    assert not Skill.objects.filter(pk=skill["id"]).exists()


def test_private_and_foreign_objects_are_404(owner: Actor, teammate: Actor, outsider: Actor) -> None:
    secret = create_skill(owner, name="secret", visibility="private")
    hidden = create_collection(owner, name="hidden", visibility="private")
    for actor in (teammate, outsider):
        browser = browser_for(actor)
        assert browser.get(f"/skills/{secret['id']}/").status_code == 404
        assert browser.get(f"/skills/{secret['id']}/edit/").status_code == 404
        assert browser.post(f"/skills/{secret['id']}/delete/").status_code == 404
        assert browser.get(f"/collections/{hidden['id']}/").status_code == 404
        assert browser.post(f"/collections/{hidden['id']}/delete/").status_code == 404
    assert Skill.objects.filter(pk=secret["id"]).exists()
    assert SkillCollection.objects.filter(pk=hidden["id"]).exists()


def test_collection_pages(owner: Actor, teammate: Actor) -> None:
    browser = browser_for(owner)
    assert browser.get("/collections/new/").status_code == 200
    response = browser.post(
        "/collections/new/",
        {"name": "my-tools", "description": "Tools.", "visibility": "private", "maintainer_users": [teammate.user.pk]},
    )
    assert response.status_code == 302
    collection = SkillCollection.objects.get(name="my-tools")
    assert [u.pk for u in collection.maintainer_users.all()] == [teammate.user.pk]
    create_skill(owner, name="inside", collectionId=collection.pk)
    detail = browser.get(f"/collections/{collection.pk}/").content.decode()
    assert "inside" in detail

    # The maintainer edits it; deleting a non-empty collection is refused with a message.
    mate = browser_for(teammate)
    edited = mate.post(
        f"/collections/{collection.pk}/edit/", {"name": "my-tools", "description": "Changed.", "visibility": "private"}
    )
    assert edited.status_code == 302
    assert SkillCollection.objects.get(pk=collection.pk).description == "Changed."
    refused = browser.post(f"/collections/{collection.pk}/delete/", follow=True)
    assert "still holds 1 skill" in refused.content.decode()
    Skill.objects.filter(collection=collection).delete()
    assert browser.post(f"/collections/{collection.pk}/delete/").status_code == 302
    assert not SkillCollection.objects.filter(pk=collection.pk).exists()


def test_render_markdown_sanitizes() -> None:
    html = str(render_markdown('<img src=x onerror="alert(1)"><a href="javascript:x()">a</a>\n\n```\ncode\n```'))
    assert "onerror" not in html and "javascript:" not in html
    assert "<code>code" in html
