from __future__ import annotations

from typing import Any

from rest_framework import serializers

from accounts.models import ApiToken, Organization, Team, User


class UserSerializer(serializers.ModelSerializer[User]):
    class Meta:
        model = User
        fields = ["id", "email", "name"]


class OrganizationSerializer(serializers.ModelSerializer[Organization]):
    sandboxesEnabled = serializers.BooleanField(source="sandboxes_enabled")
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)

    class Meta:
        model = Organization
        fields = ["id", "name", "slug", "sandboxesEnabled", "createdAt", "updatedAt"]
        read_only_fields = ["id", "slug"]


class OrganizationUpdateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, min_length=1, required=False)
    sandboxesEnabled = serializers.BooleanField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in sorted(unknown)})
        return attrs


class TeamSerializer(serializers.ModelSerializer[Team]):
    memberIds = serializers.SerializerMethodField()
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "memberIds", "createdAt"]

    def get_memberIds(self, team: Team) -> list[str]:
        return sorted(member.pk for member in team.members.all())


class MeSerializer(serializers.Serializer[Any]):
    user = UserSerializer()
    organization = OrganizationSerializer()
    role = serializers.CharField()
    teams = TeamSerializer(many=True)
    tokenReadOnly = serializers.BooleanField()


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    expiresAt = serializers.DateTimeField(source="expires_at", read_only=True)
    lastUsedAt = serializers.DateTimeField(source="last_used_at", read_only=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "createdAt", "expiresAt", "lastUsedAt", "revokedAt"]


class TokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    expiresInDays = serializers.IntegerField(min_value=1, max_value=3650, required=False)
