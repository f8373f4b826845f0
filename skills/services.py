"""Writes for skills and collections. Callers fetch the object through a selector (which applies the
permission rule) and pass it here; these functions validate, enforce name uniqueness and save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, models, transaction

from accounts.models import Team, User
from common.errors import ApiError
from common.principal import Principal
from skills import selectors, skillmd
from skills.models import Skill, SkillCollection, Visibility


@dataclass(frozen=True)
class Sharing:
    """Who a skill or collection is shared with and who maintains it; None leaves a list unchanged."""

    shared_with_user_ids: list[str] | None = None
    shared_with_team_ids: list[str] | None = None
    maintainer_user_ids: list[str] | None = None
    maintainer_team_ids: list[str] | None = None


@dataclass(frozen=True)
class SkillInput:
    """A create or update request. None means "not given" (collection: see ``set_collection``)."""

    markdown: str | None = None
    name: str | None = None
    description: str | None = None
    content: str | None = None
    visibility: str | None = None
    # collection_id None is a real value (the root), so whether it was given needs its own flag.
    set_collection: bool = False
    collection_id: str | None = None
    sharing: Sharing = field(default_factory=Sharing)


@dataclass(frozen=True)
class CollectionInput:
    name: str | None = None
    description: str | None = None
    visibility: str | None = None
    sharing: Sharing = field(default_factory=Sharing)


def _invalid(fields: dict[str, list[str]], **extra: Any) -> ApiError:
    return ApiError(
        status_code=400, code="validation_error", message="Request is invalid.", details={"fields": fields, **extra}
    )


class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.fields.setdefault(name, []).append(message)

    def raise_any(self) -> None:
        if self.fields:
            raise _invalid(self.fields)


def _document_for(data: SkillInput, current: Skill | None, errors: _Errors) -> skillmd.SkillDocument | None:
    """The SKILL.md the skill will hold: parsed from ``markdown``, or current values overlaid with fields."""
    if data.markdown is not None:
        given = [key for key in ("name", "description", "content") if getattr(data, key) is not None]
        if given:
            errors.add(
                "markdown",
                f"Give either markdown or name, description and content, not both (also given: {', '.join(given)}).",
            )
            return None
        try:
            return skillmd.parse_skill_md(data.markdown)
        except skillmd.SkillFormatError as exc:
            # The frontmatter field is also given on its own so a client can point at it.
            raise _invalid({"markdown": [exc.message]}, frontmatterField=exc.field) from None

    def pick(key: str) -> str | None:
        value: str | None = getattr(data, key)
        if value is None and current is not None:
            value = getattr(current, key)
        if value is None:
            errors.add(key, "This field is required (or give markdown).")
        return value

    name, description, content = pick("name"), pick("description"), pick("content")
    if name is not None and (problem := skillmd.text_problem(name) or skillmd.name_problem(name)):
        errors.add("name", f"name {problem}.")
    if description is not None and (problem := skillmd.description_problem(description)):
        errors.add("description", f"description {problem}.")
    if content is not None:
        if data.content is not None:
            content = skillmd.normalize_content(content)
        if problem := skillmd.content_problem(content):
            errors.add("content", f"content {problem}.")
    if name is None or description is None or content is None or errors.fields:
        return None
    extra = current.extra if current is not None else {}
    return skillmd.SkillDocument(name=name, description=description, content=content, extra=extra)


def _check_visibility(value: str | None, errors: _Errors) -> None:
    if value is not None and value not in Visibility.values:
        errors.add("visibility", f"visibility must be one of: {', '.join(Visibility.values)}.")


def _unique_ids(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _members(actor: Principal, ids: list[str] | None, key: str, errors: _Errors) -> list[User] | None:
    if ids is None:
        return None
    wanted = _unique_ids(ids)
    users = list(User.objects.filter(pk__in=wanted, memberships__organization=actor.organization))
    missing = set(wanted) - {user.pk for user in users}
    if missing:
        errors.add(key, f"Not members of this organization: {', '.join(sorted(missing))}.")
    return users


def _teams(actor: Principal, ids: list[str] | None, key: str, errors: _Errors) -> list[Team] | None:
    if ids is None:
        return None
    wanted = _unique_ids(ids)
    teams = list(Team.objects.filter(pk__in=wanted, organization=actor.organization))
    missing = set(wanted) - {team.pk for team in teams}
    if missing:
        errors.add(key, f"Not teams of this organization: {', '.join(sorted(missing))}.")
    return teams


@dataclass
class _ResolvedSharing:
    shared_with_users: list[User] | None
    shared_with_teams: list[Team] | None
    maintainer_users: list[User] | None
    maintainer_teams: list[Team] | None

    def apply(self, obj: Skill | SkillCollection) -> None:
        for relation in ("shared_with_users", "shared_with_teams", "maintainer_users", "maintainer_teams"):
            value = getattr(self, relation)
            if value is not None:
                getattr(obj, relation).set(value)


def _resolve_sharing(actor: Principal, sharing: Sharing, errors: _Errors) -> _ResolvedSharing:
    return _ResolvedSharing(
        shared_with_users=_members(actor, sharing.shared_with_user_ids, "sharedWithUserIds", errors),
        shared_with_teams=_teams(actor, sharing.shared_with_team_ids, "sharedWithTeamIds", errors),
        maintainer_users=_members(actor, sharing.maintainer_user_ids, "maintainerUserIds", errors),
        maintainer_teams=_teams(actor, sharing.maintainer_team_ids, "maintainerTeamIds", errors),
    )


def _save_with_unique_name(obj: Skill | SkillCollection, what: str) -> None:
    """Save, answering 409 when the name is taken — also when a concurrent request took it first."""
    model: type[models.Model] = type(obj)
    taken = model._default_manager.filter(organization_id=obj.organization_id, name=obj.name).exclude(pk=obj.pk)
    if taken.exists():
        raise _name_taken(what, obj.name)
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError:
        # The unique constraint is the real guarantee; the check above only gives the common case
        # a cheap answer. Anything else that failed is re-raised.
        if taken.exists():
            raise _name_taken(what, obj.name) from None
        raise


def _name_taken(what: str, name: str) -> ApiError:
    return ApiError(
        status_code=409,
        code="name_taken",
        message=f"A {what} named '{name}' already exists in this organization.",
        details={"fields": {"name": [f"A {what} with this name already exists."]}},
    )


def _target_collection(actor: Principal, data: SkillInput, errors: _Errors) -> SkillCollection | None:
    if not data.set_collection or data.collection_id is None:
        return None
    collection = selectors.collection_is_readable(actor, data.collection_id)
    if collection is None:
        # Same answer for "does not exist" and "cannot read": no existence leak through the body.
        errors.add("collectionId", "No collection with this id.")
    return collection


@transaction.atomic
def create_skill(*, actor: Principal, data: SkillInput) -> Skill:
    errors = _Errors()
    document = _document_for(data, None, errors)
    _check_visibility(data.visibility, errors)
    collection = _target_collection(actor, data, errors)
    sharing = _resolve_sharing(actor, data.sharing, errors)
    errors.raise_any()
    assert document is not None
    skill = Skill(
        organization=actor.organization,
        name=document.name,
        description=document.description,
        content=document.content,
        frontmatter_extra=skillmd.dump_extra(document.extra),
        visibility=data.visibility or Visibility.ORGANIZATION,
        collection=collection,
        created_by=actor.user,
    )
    _save_with_unique_name(skill, "skill")
    sharing.apply(skill)
    return skill


@transaction.atomic
def update_skill(*, actor: Principal, skill: Skill, data: SkillInput) -> Skill:
    """``skill`` must come from ``selectors.get_editable_skill``."""
    errors = _Errors()
    touches_document = any(getattr(data, key) is not None for key in ("markdown", "name", "description", "content"))
    document = _document_for(data, skill, errors) if touches_document else None
    _check_visibility(data.visibility, errors)
    collection = _target_collection(actor, data, errors)
    sharing = _resolve_sharing(actor, data.sharing, errors)
    errors.raise_any()
    if document is not None:
        skill.name = document.name
        skill.description = document.description
        skill.content = document.content
        skill.frontmatter_extra = skillmd.dump_extra(document.extra)
    if data.visibility is not None:
        skill.visibility = data.visibility
    if data.set_collection:
        skill.collection = collection
    # Saved even when only sharing changed: updatedAt tells a syncing client something moved.
    _save_with_unique_name(skill, "skill")
    sharing.apply(skill)
    return skill


@transaction.atomic
def delete_skill(*, actor: Principal, skill: Skill) -> None:
    skill.delete()


def _collection_fields(data: CollectionInput, current: SkillCollection | None, errors: _Errors) -> None:
    if data.name is not None:
        if problem := skillmd.text_problem(data.name) or skillmd.name_problem(data.name):
            errors.add("name", f"name {problem}.")
    elif current is None:
        errors.add("name", "This field is required.")
    if data.description is not None and (
        problem := skillmd.description_problem(
            data.description, maximum=skillmd.COLLECTION_DESCRIPTION_MAX, required=False
        )
    ):
        errors.add("description", f"description {problem}.")
    _check_visibility(data.visibility, errors)


@transaction.atomic
def create_collection(*, actor: Principal, data: CollectionInput) -> SkillCollection:
    errors = _Errors()
    _collection_fields(data, None, errors)
    sharing = _resolve_sharing(actor, data.sharing, errors)
    errors.raise_any()
    assert data.name is not None
    collection = SkillCollection(
        organization=actor.organization,
        name=data.name,
        description=data.description or "",
        visibility=data.visibility or Visibility.ORGANIZATION,
        created_by=actor.user,
    )
    _save_with_unique_name(collection, "collection")
    sharing.apply(collection)
    return collection


@transaction.atomic
def update_collection(*, actor: Principal, collection: SkillCollection, data: CollectionInput) -> SkillCollection:
    """``collection`` must come from ``selectors.get_editable_collection``."""
    errors = _Errors()
    _collection_fields(data, collection, errors)
    sharing = _resolve_sharing(actor, data.sharing, errors)
    errors.raise_any()
    if data.name is not None:
        collection.name = data.name
    if data.description is not None:
        collection.description = data.description
    if data.visibility is not None:
        collection.visibility = data.visibility
    _save_with_unique_name(collection, "collection")
    sharing.apply(collection)
    return collection


@transaction.atomic
def delete_collection(*, actor: Principal, collection: SkillCollection) -> None:
    """Refused while the collection holds skills: moving them would change who can read them, and
    the caller may not be allowed to edit them."""
    count = Skill.objects.filter(collection=collection).count()
    if count:
        raise ApiError(
            status_code=409,
            code="collection_not_empty",
            message=f"The collection still holds {count} skill(s); move or delete them first.",
            details={"skillCount": count},
        )
    collection.delete()
