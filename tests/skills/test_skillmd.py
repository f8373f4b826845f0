"""SKILL.md parsing: examples of each rule, and properties checked with hypothesis."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skills import skillmd
from skills.models import Skill
from skills.skillmd import SkillDocument, SkillFormatError, parse_skill_md, render_skill_md
from tests.conftest import Actor
from tests.skills.conftest import SKILL_MD, api, create_skill

# --- examples -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "field", "words"),
    [
        ("---\nname: 123\ndescription: d\n---\nb", "name", "must be a string, not an integer"),
        ("---\nname: a\ndescription: yes\n---\nb", "description", "must be a string, not a boolean"),
        ("---\nname: a\ndescription: null\n---\nb", "description", "not null"),
        ("---\nname: a\n---\nb", "description", "Missing required field"),
        ("---\nname: A\ndescription: d\n---\nb", "name", "lowercase"),
        ("---\nname: a\ndescription: '  '\n---\nb", "description", "must not be empty"),
        ("---\nname: a\ndescription: d\nlicense: 3\n---\nb", "license", "must be a string"),
        ("---\nname: a\ndescription: d\ncompatibility: ''\n---\nb", "compatibility", "1 to 500"),
        ("---\nname: a\ndescription: d\nmetadata: [a]\n---\nb", "metadata", "strings to strings"),
        ("---\nname: a\ndescription: d\nx: !!binary aGVsbG8=\n---\nb", "x", "not supported"),
        ("---\nname: a\ndescription: d\nx: !!set {a}\n---\nb", "x", "not supported"),
        ("---\nname: a\ndescription: d\nx: .inf\n---\nb", "x", "finite"),
        ('---\nname: a\ndescription: "a\\0b"\n---\nb', "description", "NUL"),
    ],
)
def test_field_errors_name_the_field(markdown: str, field: str, words: str) -> None:
    with pytest.raises(SkillFormatError) as caught:
        parse_skill_md(markdown)
    assert caught.value.field == field
    assert f"'{field}'" in caught.value.message or f": {field}" in caught.value.message
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("markdown", "words"),
    [
        ("", "first line must be ---"),
        ("name: a\n", "first line must be ---"),
        ("---\nname: a\ndescription: d\n", "not closed"),
        ("---\n---\nbody", "mapping, not null"),
        ("---\n- a\n---\nbody", "mapping, not a list"),
        ("---\nname: a\ndescription: d\n---\n\n  \n", "must not be empty"),
        ("---\nname: a\nname: a\ndescription: d\n---\nb", "duplicate key 'name'"),
        ("---\na: &x 1\nname: a\ndescription: d\n---\nb", "anchors"),
        ("---\nname: a\ndescription: d\nx: *y\n---\nb", "aliases"),
        ("---\n<<: {name: a}\ndescription: d\n---\nb", "merge keys"),
        ("---\n1: a\nname: a\ndescription: d\n---\nb", "keys must be strings"),
        ("---\nname: a\ndescription: d\nx: " + "[" * 40 + "]" * 40 + "\n---\nb", "nesting"),
        ("---\nname: [a\n---\nb", "Invalid YAML"),
        ("---\nname: a\ndescription: d\nx: " + "y" * skillmd.FRONTMATTER_MAX + "\n---\nb", "at most 32768"),
        ("x" * (skillmd.MARKDOWN_MAX + 1), "at most 204800"),
    ],
)
def test_document_errors(markdown: str, words: str) -> None:
    with pytest.raises(SkillFormatError) as caught:
        parse_skill_md(markdown)
    assert words in caught.value.message


def test_bom_crlf_and_blank_lines_are_normalized() -> None:
    parsed = parse_skill_md("\ufeff---\r\nname: a\r\ndescription: d\r\n---\r\n\r\n\r\nLine 1\r\nLine 2\r")
    assert parsed == SkillDocument(name="a", description="d", content="Line 1\nLine 2\n", extra={})


def test_dates_and_yaml_11_words_in_unknown_fields_stay_as_parsed() -> None:
    parsed = parse_skill_md("---\nname: a\ndescription: d\nwhen: 2024-01-02\nflag: on\n---\nb")
    assert parsed.extra == {"when": "2024-01-02", "flag": True}
    assert parse_skill_md(render_skill_md(parsed)) == parsed


def test_optional_fields_round_trip_in_order() -> None:
    parsed = parse_skill_md(SKILL_MD)
    assert list(parsed.extra) == ["license", "compatibility", "metadata", "allowed-tools", "x-custom-flag"]
    rendered = render_skill_md(parsed)
    assert list(parse_skill_md(rendered).extra) == list(parsed.extra)
    assert render_skill_md(parse_skill_md(rendered)) == rendered


def _target(owner: Actor) -> str:
    # Hypothesis runs every example inside one test's transaction, so the one skill persists between
    # them (renamed by each example's document).
    existing = Skill.objects.filter(organization=owner.organization).first()
    return existing.pk if existing else str(create_skill(owner, name="target")["id"])


# --- properties ------------------------------------------------------------------------------------

# Lone surrogates cannot be encoded and NUL cannot be stored; both are refused (tested above).
_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
_text = st.text(_CHARS, min_size=1, max_size=60)
names = st.from_regex(r"\A[a-z0-9]{1,10}(-[a-z0-9]{1,10}){0,4}\Z")
descriptions = _text.filter(lambda value: bool(value.strip()))
contents = st.text(_CHARS, min_size=1, max_size=400).filter(
    lambda value: bool(skillmd.normalize_content(value).strip())
)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
    max_leaves=8,
)
extras = st.fixed_dictionaries(
    {},
    optional={
        "license": _text,
        "compatibility": _text.filter(lambda value: bool(value.strip())),
        "metadata": st.dictionaries(_text, _text, max_size=3),
        "allowed-tools": _text,
        "x-unknown": json_values,
        "another": json_values,
    },
)


@st.composite
def documents(draw: st.DrawFn) -> SkillDocument:
    return SkillDocument(
        name=draw(names),
        description=draw(descriptions),
        content=skillmd.normalize_content(draw(contents)),
        extra=draw(extras),
    )


@settings(max_examples=300, deadline=None)
@given(document=documents(), crlf=st.booleans(), bom=st.booleans())
def test_parse_render_parse_is_identity(document: SkillDocument, crlf: bool, bom: bool) -> None:
    markdown = render_skill_md(document)
    if crlf:
        markdown = markdown.replace("\n", "\r\n")
    if bom:
        markdown = "\ufeff" + markdown
    first = parse_skill_md(markdown)
    second = parse_skill_md(render_skill_md(first))
    assert second == first
    assert render_skill_md(second) == render_skill_md(first)
    # Nothing that was rendered from a valid document is lost on the way (CRLF aside, normalized away).
    if not crlf:
        assert first == document


@settings(max_examples=400, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        parsed = parse_skill_md(text)
    except SkillFormatError as exc:
        assert exc.message
    else:
        assert parse_skill_md(render_skill_md(parsed)) == parsed


def _broken(document: SkillDocument, how: str, value: Any) -> tuple[str, str]:
    """A rendered document with one field replaced by a bad value: (markdown, field)."""
    front: dict[str, Any] = {"name": document.name, "description": document.description, **document.extra}
    front[how] = value
    return f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n{document.content}", how


bad_values = st.sampled_from(
    [
        ("name", 123),
        ("name", True),
        ("name", None),
        ("name", "Has Spaces"),
        ("name", "x" * 65),
        ("name", ["a"]),
        ("description", False),
        ("description", 1.5),
        ("description", {"a": "b"}),
        ("description", "x" * 1025),
        ("compatibility", "x" * 501),
        ("compatibility", 7),
        ("metadata", {"k": 1}),
        ("metadata", "text"),
        ("license", ["MIT"]),
        ("allowed-tools", ["Read"]),
    ]
)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=documents(), bad=bad_values)
def test_invalid_markdown_is_a_400_naming_the_field(
    owner: Actor, document: SkillDocument, bad: tuple[str, Any]
) -> None:
    markdown, field = _broken(document, *bad)
    response = api(owner.client(), "post", "/api/v1/skills", {"markdown": markdown})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert error["details"]["frontmatterField"] == field
    assert field in error["details"]["fields"]["markdown"][0]


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_arbitrary_markdown_never_breaks_the_api(owner: Actor, text: str) -> None:
    skill_id = _target(owner)
    response = api(owner.client(), "put", f"/api/v1/skills/{skill_id}", {"markdown": text})
    assert response.status_code in (200, 400), response.content
    if response.status_code == 400:
        assert response.json()["error"]["details"]["fields"]["markdown"]
    else:
        # Valid: what is stored renders back to the same document.
        fetched = owner.client().get(f"/api/v1/skills/{skill_id}/skill.md").content.decode()
        assert parse_skill_md(fetched) == parse_skill_md(text)


@pytest.mark.django_db
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=documents())
def test_valid_documents_round_trip_through_the_api(owner: Actor, document: SkillDocument) -> None:
    markdown = render_skill_md(document)
    target = _target(owner)
    response = api(owner.client(), "put", f"/api/v1/skills/{target}", {"markdown": markdown})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["description"], body["content"]) == (
        document.name,
        document.description,
        document.content,
    )
    fetched = owner.client().get(f"/api/v1/skills/{target}/skill.md").content.decode()
    assert parse_skill_md(fetched) == document
