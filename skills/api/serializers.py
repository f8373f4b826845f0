from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from skills import skillmd
from skills.models import Skill, Visibility

_ID_LIST = serializers.ListField(child=serializers.CharField())


@extend_schema_field(_ID_LIST)
class IdListField(serializers.Field):
    """Sorted ids of a prefetched many-to-many relation (sorted so a listing's ETag is stable)."""

    def to_representation(self, value: Any) -> list[str]:
        return sorted(obj.pk for obj in value.all())


@extend_schema_field(_ID_LIST)
class CollectionIdListField(serializers.Field):
    """A relation of the skill's collection; an empty list for a skill at the root."""

    def __init__(self, relation: str, **kwargs: Any) -> None:
        self.relation = relation
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, value: Skill) -> list[str]:
        if value.collection is None:
            return []
        return sorted(obj.pk for obj in getattr(value.collection, self.relation).all())


class _CreatorFields(serializers.Serializer[Any]):
    createdByUserId = serializers.CharField(source="created_by.pk", allow_null=True, read_only=True)
    createdByUserName = serializers.CharField(source="created_by.name", allow_null=True, read_only=True)
    createdByUserEmail = serializers.CharField(source="created_by.email", allow_null=True, read_only=True)
    sharedWithUserIds = IdListField(source="shared_with_users", read_only=True)
    sharedWithTeamIds = IdListField(source="shared_with_teams", read_only=True)
    maintainerUserIds = IdListField(source="maintainer_users", read_only=True)
    maintainerTeamIds = IdListField(source="maintainer_teams", read_only=True)
    canEdit = serializers.BooleanField(source="can_edit", read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)


class SkillSerializer(_CreatorFields):
    id = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    visibility = serializers.ChoiceField(choices=Visibility.choices, read_only=True)
    collectionId = serializers.CharField(source="collection_id", allow_null=True, read_only=True)
    collectionName = serializers.CharField(source="collection.name", allow_null=True, read_only=True)
    contentBytes = serializers.IntegerField(source="content_bytes", read_only=True)
    collectionVisibility = serializers.ChoiceField(
        source="collection.visibility", choices=Visibility.choices, allow_null=True, read_only=True
    )
    collectionSharedWithUserIds = CollectionIdListField("shared_with_users")
    collectionSharedWithTeamIds = CollectionIdListField("shared_with_teams")
    collectionMaintainerUserIds = CollectionIdListField("maintainer_users")
    collectionMaintainerTeamIds = CollectionIdListField("maintainer_teams")
    etag = serializers.CharField(read_only=True, help_text="The ETag of this skill's skill.md, without quotes.")

    field_order = [
        "id", "name", "description", "visibility", "collectionId", "collectionName", "contentBytes",
        "createdByUserId", "createdByUserName", "createdByUserEmail", "sharedWithUserIds", "sharedWithTeamIds",
        "maintainerUserIds", "maintainerTeamIds", "collectionVisibility", "collectionSharedWithUserIds",
        "collectionSharedWithTeamIds", "collectionMaintainerUserIds", "collectionMaintainerTeamIds",
        "createdAt", "updatedAt", "etag", "canEdit",
    ]  # fmt: skip

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {name: fields[name] for name in self.field_order if name in fields} | fields


class SkillDetailSerializer(SkillSerializer):
    content = serializers.CharField(read_only=True, help_text="The instructions: the SKILL.md body.")
    frontmatter = serializers.DictField(
        source="extra", read_only=True, help_text="Frontmatter fields besides name and description."
    )


class SkillCollectionSerializer(_CreatorFields):
    id = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    visibility = serializers.ChoiceField(choices=Visibility.choices, read_only=True)
    skillCount = serializers.IntegerField(source="skill_count", read_only=True)

    field_order = [
        "id", "name", "description", "visibility", "createdByUserId", "createdByUserName", "createdByUserEmail",
        "sharedWithUserIds", "sharedWithTeamIds", "maintainerUserIds", "maintainerTeamIds", "skillCount",
        "createdAt", "updatedAt", "canEdit",
    ]  # fmt: skip

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {name: fields[name] for name in self.field_order if name in fields} | fields


class CollectionSkillsSerializer(serializers.Serializer[Any]):
    collection = SkillCollectionSerializer()
    results = SkillSerializer(many=True)


class _StrictInput(serializers.Serializer[Any]):
    """Unknown fields are an error: a misspelt field silently ignored is a change that never happened."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in sorted(unknown)})
        return attrs


def _text(**kwargs: Any) -> serializers.CharField:
    # Whitespace is meaningful in Markdown (a trailing newline, indentation), so nothing is trimmed.
    return serializers.CharField(required=False, trim_whitespace=False, allow_blank=True, **kwargs)


def _ids() -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=1000)


class _SharingInput(_StrictInput):
    sharedWithUserIds = _ids()
    sharedWithTeamIds = _ids()
    maintainerUserIds = _ids()
    maintainerTeamIds = _ids()


class SkillWriteSerializer(_SharingInput):
    markdown = _text(
        max_length=skillmd.MARKDOWN_MAX, help_text="A whole SKILL.md; not together with name, description or content."
    )
    name = _text(max_length=skillmd.NAME_MAX)
    description = _text(max_length=skillmd.DESCRIPTION_MAX)
    content = _text(max_length=skillmd.CONTENT_MAX)
    visibility = serializers.ChoiceField(choices=Visibility.choices, required=False)
    collectionId = serializers.CharField(required=False, allow_null=True, help_text="null: the root.")


class CollectionWriteSerializer(_SharingInput):
    name = _text(max_length=skillmd.NAME_MAX)
    description = _text(max_length=skillmd.COLLECTION_DESCRIPTION_MAX)
    visibility = serializers.ChoiceField(choices=Visibility.choices, required=False)
