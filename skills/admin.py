from __future__ import annotations

from django.contrib import admin

from skills.models import Skill, SkillCollection


class SkillInline(admin.TabularInline[Skill, SkillCollection]):
    model = Skill
    fields = ["name", "description", "visibility"]
    readonly_fields = ["name", "description", "visibility"]
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(SkillCollection)
class SkillCollectionAdmin(admin.ModelAdmin[SkillCollection]):
    list_display = ["name", "organization", "visibility", "created_by", "created_at", "updated_at"]
    list_filter = ["visibility"]
    search_fields = ["name", "description", "organization__slug"]
    autocomplete_fields = ["organization", "created_by"]
    filter_horizontal = ["shared_with_users", "shared_with_teams", "maintainer_users", "maintainer_teams"]
    readonly_fields = ["id", "created_at", "updated_at"]
    inlines = [SkillInline]


@admin.register(Skill)
class SkillAdmin(admin.ModelAdmin[Skill]):
    list_display = ["name", "organization", "collection", "visibility", "content_bytes", "created_by", "updated_at"]
    list_filter = ["visibility"]
    search_fields = ["name", "description", "organization__slug"]
    autocomplete_fields = ["organization", "created_by", "collection"]
    filter_horizontal = ["shared_with_users", "shared_with_teams", "maintainer_users", "maintainer_teams"]
    # content_bytes and etag are derived in Skill.save, so admin edits keep them right.
    readonly_fields = ["id", "content_bytes", "etag", "created_at", "updated_at"]
