from __future__ import annotations

from typing import Any

from rest_framework import serializers

from skills import selectors, skillmd
from skills.models import Skill, SkillCollection, Visibility


def _id_list(source: str) -> serializers.ListField:
    # Filled by selectors.attach_*_relations (sorted, so a listing's ETag is stable).
    return serializers.ListField(child=serializers.CharField(), source=source, read_only=True)


class _AttachingListSerializer(serializers.ListSerializer):
    """Loads the sharing/maintainer ids of a whole list at once, before the items are serialized."""

    def to_representation(self, data: Any) -> list[Any]:
        items = list(data.all() if hasattr(data, "all") else data)
        attach = getattr(self.child, "attach", None)
        if attach is not None:
            attach(items)
        return super().to_representation(items)


class _CreatorFields(serializers.Serializer[Any]):
    createdByUserId = serializers.CharField(source="created_by.pk", allow_null=True, read_only=True)
    createdByUserName = serializers.CharField(source="created_by.name", allow_null=True, read_only=True)
    createdByUserEmail = serializers.CharField(source="created_by.email", allow_null=True, read_only=True)
    sharedWithUserIds = _id_list("relation_ids.shared_with_users")
    sharedWithTeamIds = _id_list("relation_ids.shared_with_teams")
    maintainerUserIds = _id_list("relation_ids.maintainer_users")
    maintainerTeamIds = _id_list("relation_ids.maintainer_teams")
    canEdit = serializers.BooleanField(source="can_edit", read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)


class SkillSerializer(_CreatorFields):
    class Meta:
        list_serializer_class = _AttachingListSerializer

    @staticmethod
    def attach(skills: list[Skill]) -> None:
        selectors.attach_skill_relations(skills)

    def to_representation(self, instance: Skill) -> dict[str, Any]:
        self.attach([instance])
        return super().to_representation(instance)

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
    collectionSharedWithUserIds = _id_list("collection_relation_ids.shared_with_users")
    collectionSharedWithTeamIds = _id_list("collection_relation_ids.shared_with_teams")
    collectionMaintainerUserIds = _id_list("collection_relation_ids.maintainer_users")
    collectionMaintainerTeamIds = _id_list("collection_relation_ids.maintainer_teams")
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
    class Meta:
        list_serializer_class = _AttachingListSerializer

    @staticmethod
    def attach(collections: list[SkillCollection]) -> None:
        selectors.attach_collection_relations(collections)

    def to_representation(self, instance: SkillCollection) -> dict[str, Any]:
        self.attach([instance])
        return super().to_representation(instance)

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
