"""Reads for skills and collections. The permission rule lives here, once, as SQL conditions.

Read a collection: it is organization-visible, or you created it, it is shared with you or a team of
yours, or you (or a team of yours) maintain it.
Read a skill: it is organization-visible, or you created it, it is shared with you or a team of yours,
you (or a team of yours) maintain it, or it sits in a collection you can read.
Edit (either): you can read it and you created it, maintain it (for a skill: or maintain its collection),
or you are an organization owner or admin.
Anything you cannot read is "not found"; readable but not editable is "permission denied".
See docs/skills.md for the same rule as a table (the permission tests are generated from it).
"""

from __future__ import annotations

from typing import Any

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet, Value

from accounts.models import Team, User
from common.errors import ApiError, not_found
from common.principal import Principal
from skills.models import Skill, SkillCollection, Visibility


def _team_ids(principal: Principal) -> QuerySet[Team, Any]:
    return Team.objects.filter(organization=principal.organization, members=principal.user).values("pk")


def _involved(model: type[Skill] | type[SkillCollection], principal: Principal, *relations: str) -> Q:
    """Rows where the caller is named in any of ``relations`` (user M2Ms) or their ``…_teams`` twins.

    Each relation is its own ``pk IN (subquery)`` so the outer query needs no joins and no DISTINCT.
    """
    teams = _team_ids(principal)
    condition = Q()
    for relation in relations:
        condition |= Q(pk__in=model.objects.filter(**{f"{relation}_users": principal.user}).values("pk"))
        condition |= Q(pk__in=model.objects.filter(**{f"{relation}_teams__in": teams}).values("pk"))
    return condition


def collection_read_q(principal: Principal) -> Q:
    return (
        Q(visibility=Visibility.ORGANIZATION)
        | Q(created_by=principal.user)
        | _involved(SkillCollection, principal, "shared_with", "maintainer")
    )


def collection_edit_q(principal: Principal) -> Q:
    return Q(created_by=principal.user) | _involved(SkillCollection, principal, "maintainer")


def _readable_collection_ids(principal: Principal) -> QuerySet[SkillCollection, Any]:
    return SkillCollection.objects.filter(collection_read_q(principal), organization=principal.organization).values(
        "pk"
    )


def skill_read_q(principal: Principal) -> Q:
    return (
        Q(visibility=Visibility.ORGANIZATION)
        | Q(created_by=principal.user)
        | _involved(Skill, principal, "shared_with", "maintainer")
        | Q(collection__in=_readable_collection_ids(principal))
    )


def skill_edit_q(principal: Principal) -> Q:
    maintained_collections = SkillCollection.objects.filter(
        _involved(SkillCollection, principal, "maintainer"), organization=principal.organization
    ).values("pk")
    return (
        Q(created_by=principal.user)
        | _involved(Skill, principal, "maintainer")
        | Q(collection__in=maintained_collections)
    )


def _can_edit(principal: Principal, condition: Q) -> ExpressionWrapper[Q] | Value:
    if principal.is_admin:
        return Value(True, output_field=BooleanField())
    return ExpressionWrapper(condition, output_field=BooleanField())


RELATIONS = ("shared_with_users", "shared_with_teams", "maintainer_users", "maintainer_teams")
# Bounded so an IN list stays far below every database's parameter limit; a page is at most 200.
_CHUNK = 5000


def _relation_ids(model: type[Skill] | type[SkillCollection], pks: list[str]) -> dict[str, dict[str, list[str]]]:
    """For each object, the sorted ids in each sharing/maintainer relation: one query per relation.

    Reading the through tables' id pairs directly is several times cheaper than prefetch_related,
    which builds a model instance for every related row.
    """
    found: dict[str, dict[str, list[str]]] = {pk: {relation: [] for relation in RELATIONS} for pk in pks}
    for relation in RELATIONS:
        field = model._meta.get_field(relation)
        through: Any = field.remote_field.through  # type: ignore[union-attr]
        source, target = field.m2m_field_name(), field.m2m_reverse_field_name()  # type: ignore[union-attr]
        for start in range(0, len(pks), _CHUNK):
            rows = (
                through.objects.filter(**{f"{source}_id__in": pks[start : start + _CHUNK]})
                .order_by(f"{target}_id")
                .values_list(f"{source}_id", f"{target}_id")
            )
            for owner, other in rows:
                found[owner][relation].append(other)
    return found


def attach_skill_relations(skills: list[Skill]) -> None:
    """Set ``relation_ids`` and ``collection_relation_ids`` (what the serializers read) on each skill."""
    pending = [skill for skill in skills if not hasattr(skill, "relation_ids")]
    if not pending:
        return
    own = _relation_ids(Skill, list({skill.pk for skill in pending}))
    collection_pks = list({skill.collection_id for skill in pending if skill.collection_id})
    of_collections = _relation_ids(SkillCollection, collection_pks) if collection_pks else {}
    empty: dict[str, list[str]] = {relation: [] for relation in RELATIONS}
    for skill in pending:
        skill.relation_ids = own[skill.pk]  # type: ignore[attr-defined]
        skill.collection_relation_ids = of_collections.get(skill.collection_id or "", empty)  # type: ignore[attr-defined]


def attach_collection_relations(collections: list[SkillCollection]) -> None:
    pending = [collection for collection in collections if not hasattr(collection, "relation_ids")]
    if not pending:
        return
    own = _relation_ids(SkillCollection, list({collection.pk for collection in pending}))
    for collection in pending:
        collection.relation_ids = own[collection.pk]  # type: ignore[attr-defined]


def organization_skills(principal: Principal, *, with_content: bool = False) -> QuerySet[Skill]:
    """Every skill of the caller's organization, ready to serialize, with ``can_edit`` computed.

    Not permission-filtered: use ``readable_skills`` for anything a caller asks for.
    """
    queryset = (
        Skill.objects.filter(organization=principal.organization)
        .select_related("collection", "created_by")
        .annotate(can_edit=_can_edit(principal, skill_edit_q(principal)))
    )
    return queryset if with_content else queryset.defer("content")


def readable_skills(principal: Principal, *, with_content: bool = False) -> QuerySet[Skill]:
    return organization_skills(principal, with_content=with_content).filter(skill_read_q(principal))


def get_readable_skill(principal: Principal, skill_id: str, *, with_content: bool = True) -> Skill:
    skill = readable_skills(principal, with_content=with_content).filter(pk=skill_id).first()
    if skill is None:
        raise not_found("Skill")
    return skill


def get_readable_skill_by_name(principal: Principal, name: str) -> Skill:
    skill = readable_skills(principal, with_content=True).filter(name=name).first()
    if skill is None:
        raise not_found("Skill")
    return skill


def get_editable_skill(principal: Principal, skill_id: str) -> Skill:
    skill = get_readable_skill(principal, skill_id)
    if not skill.can_edit:  # type: ignore[attr-defined]
        raise ApiError(
            status_code=403,
            code="permission_denied",
            message="Only the creator, maintainers of the skill or its collection, and admins may change this skill.",
        )
    return skill


def filter_skills(
    queryset: QuerySet[Skill], *, collection_id: str | None = None, visibility: str | None = None, text: str = ""
) -> QuerySet[Skill]:
    """``collection_id`` "root" selects skills outside any collection."""
    if collection_id == "root":
        queryset = queryset.filter(collection__isnull=True)
    elif collection_id:
        queryset = queryset.filter(collection_id=collection_id)
    if visibility:
        queryset = queryset.filter(visibility=visibility)
    if text:
        queryset = queryset.filter(Q(name__icontains=text) | Q(description__icontains=text))
    return queryset


def organization_collections(principal: Principal) -> QuerySet[SkillCollection]:
    return (
        SkillCollection.objects.filter(organization=principal.organization)
        .select_related("created_by")
        .annotate(
            skill_count=Count("skills", distinct=True),
            can_edit=_can_edit(principal, collection_edit_q(principal)),
        )
    )


def readable_collections(principal: Principal) -> QuerySet[SkillCollection]:
    return organization_collections(principal).filter(collection_read_q(principal))


def filter_collections(
    queryset: QuerySet[SkillCollection], *, visibility: str | None = None, text: str = ""
) -> QuerySet[SkillCollection]:
    if visibility:
        queryset = queryset.filter(visibility=visibility)
    if text:
        queryset = queryset.filter(Q(name__icontains=text) | Q(description__icontains=text))
    return queryset


def get_readable_collection(principal: Principal, collection_id: str) -> SkillCollection:
    collection = readable_collections(principal).filter(pk=collection_id).first()
    if collection is None:
        raise not_found("Collection")
    return collection


def get_readable_collection_by_name(principal: Principal, name: str) -> SkillCollection:
    collection = readable_collections(principal).filter(name=name).first()
    if collection is None:
        raise not_found("Collection")
    return collection


def get_editable_collection(principal: Principal, collection_id: str) -> SkillCollection:
    collection = get_readable_collection(principal, collection_id)
    if not collection.can_edit:  # type: ignore[attr-defined]
        raise ApiError(
            status_code=403,
            code="permission_denied",
            message="Only the creator, maintainers of the collection, and admins may change this collection.",
        )
    return collection


def collection_is_readable(principal: Principal, collection_id: str) -> SkillCollection | None:
    """The collection, when the caller may read it (used to check a move into a collection)."""
    return (
        SkillCollection.objects.filter(collection_read_q(principal), organization=principal.organization)
        .filter(pk=collection_id)
        .first()
    )


def collection_skills(principal: Principal, collection: SkillCollection) -> QuerySet[Skill]:
    # Every skill of a readable collection is readable (it sits in a collection the caller can read).
    return organization_skills(principal).filter(collection=collection).order_by("name")


def member_choices(principal: Principal) -> QuerySet[User]:
    return User.objects.filter(memberships__organization=principal.organization).order_by("email")


def team_choices(principal: Principal) -> QuerySet[Team]:
    return Team.objects.filter(organization=principal.organization).order_by("name")
