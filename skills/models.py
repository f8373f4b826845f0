"""Skills (SKILL.md documents) and the collections that group them, each with visibility and sharing."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import models

from accounts.models import Organization, Team, User
from common.ids import PublicIdField
from skills import skillmd

# The database enforces the name rule too, so no write path (admin, shell, a bug) can store a name
# the API would refuse to round-trip.
NAME_REGEX = r"^[a-z0-9]+(-[a-z0-9]+)*$"


class Visibility(models.TextChoices):
    ORGANIZATION = "organization", "Organization"
    PRIVATE = "private", "Private"


class SkillCollection(models.Model):
    id = PublicIdField(prefix="skc")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="skill_collections")
    name = models.CharField(max_length=skillmd.NAME_MAX)
    description = models.CharField(max_length=skillmd.COLLECTION_DESCRIPTION_MAX, blank=True)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.ORGANIZATION)
    # Kept when the creator's account goes away: the collection belongs to the organization.
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    shared_with_users = models.ManyToManyField(User, blank=True, related_name="collections_shared_with")
    shared_with_teams = models.ManyToManyField(Team, blank=True, related_name="collections_shared_with")
    maintainer_users = models.ManyToManyField(User, blank=True, related_name="collections_maintained")
    maintainer_teams = models.ManyToManyField(Team, blank=True, related_name="collections_maintained")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="uniq_skill_collection_name"),
            models.CheckConstraint(condition=models.Q(name__regex=NAME_REGEX), name="skill_collection_name_format"),
            models.CheckConstraint(
                condition=models.Q(visibility__in=Visibility.values), name="skill_collection_visibility_valid"
            ),
        ]
        indexes = [models.Index(fields=["organization", "created_at"])]

    def __str__(self) -> str:
        return self.name


class Skill(models.Model):
    id = PublicIdField(prefix="skl")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="skills")
    name = models.CharField(max_length=skillmd.NAME_MAX)
    description = models.CharField(max_length=skillmd.DESCRIPTION_MAX)
    content = models.TextField()
    # Optional and unknown frontmatter fields as JSON text, in document order (see skillmd.dump_extra).
    frontmatter_extra = models.TextField(blank=True, default="")
    # Derived on save, so lists never load the (up to 200 KiB) content to report its size or ETag.
    content_bytes = models.PositiveIntegerField(default=0, editable=False)
    etag = models.CharField(max_length=64, blank=True, editable=False)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.ORGANIZATION)
    # RESTRICT: a collection is deleted only once empty (see docs/skills.md), yet deleting the whole
    # organization still cascades to both (PROTECT would block that).
    collection = models.ForeignKey(
        SkillCollection, on_delete=models.RESTRICT, null=True, blank=True, related_name="skills"
    )
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    shared_with_users = models.ManyToManyField(User, blank=True, related_name="skills_shared_with")
    shared_with_teams = models.ManyToManyField(Team, blank=True, related_name="skills_shared_with")
    maintainer_users = models.ManyToManyField(User, blank=True, related_name="skills_maintained")
    maintainer_teams = models.ManyToManyField(Team, blank=True, related_name="skills_maintained")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="uniq_skill_name"),
            models.CheckConstraint(condition=models.Q(name__regex=NAME_REGEX), name="skill_name_format"),
            models.CheckConstraint(condition=models.Q(visibility__in=Visibility.values), name="skill_visibility_valid"),
        ]
        indexes = [models.Index(fields=["organization", "created_at"])]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.content_bytes = len(self.content.encode("utf-8"))
        self.etag = hashlib.sha256(self.markdown().encode("utf-8")).hexdigest()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "content_bytes", "etag", "updated_at"}
        super().save(*args, **kwargs)

    @property
    def extra(self) -> dict[str, Any]:
        return skillmd.load_extra(self.frontmatter_extra)

    def document(self) -> skillmd.SkillDocument:
        return skillmd.SkillDocument(
            name=self.name, description=self.description, content=self.content, extra=self.extra
        )

    def markdown(self) -> str:
        return skillmd.render_skill_md(self.document())
