from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import ApiToken, Membership, Organization, Team, User


class MembershipInline(admin.TabularInline[Membership, User]):
    model = Membership
    extra = 0
    autocomplete_fields = ["organization"]


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    ordering = ["email"]
    list_display = ["email", "name", "is_active", "is_staff", "date_joined"]
    list_filter = ["is_active", "is_staff"]
    search_fields = ["email", "name"]
    fieldsets = (
        (None, {"fields": ("email", "name", "password")}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")}),
        ("Dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("email", "password1", "password2")}),)
    inlines = [MembershipInline]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin[Organization]):
    list_display = ["slug", "name", "sandboxes_enabled", "created_at"]
    list_filter = ["sandboxes_enabled"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "organization__slug"]
    autocomplete_fields = ["user", "organization"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ["name", "slug", "organization", "created_at"]
    search_fields = ["name", "slug", "organization__slug"]
    filter_horizontal = ["members"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = [
        "prefix",
        "name",
        "user",
        "organization",
        "read_only",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["read_only"]
    search_fields = ["prefix", "name", "user__email", "organization__slug"]
    # The hash is useless to a person and the raw token is never stored: nothing secret is editable.
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]
