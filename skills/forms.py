"""Dashboard forms. They only shape input; validation and permissions are the services' and selectors'."""

from __future__ import annotations

from typing import Any

from django import forms

from common.principal import Principal
from skills import selectors, skillmd
from skills.models import Visibility

ROOT = ""

# API field names (as services report them) → form field names, to show each error next to its field.
API_TO_FORM = {
    "name": "name",
    "description": "description",
    "content": "content",
    "markdown": "markdown",
    "visibility": "visibility",
    "collectionId": "collection",
    "sharedWithUserIds": "shared_with_users",
    "sharedWithTeamIds": "shared_with_teams",
    "maintainerUserIds": "maintainer_users",
    "maintainerTeamIds": "maintainer_teams",
}


def _set_choices(field: forms.Field, choices: list[tuple[str, str]]) -> None:
    assert isinstance(field, forms.ChoiceField)
    field.choices = choices


def _pickers(form: forms.Form, principal: Principal) -> None:
    people = [
        (user.pk, f"{user.name} <{user.email}>" if user.name else user.email)
        for user in selectors.member_choices(principal)
    ]
    teams = [(team.pk, team.name) for team in selectors.team_choices(principal)]
    for name, choices in (
        ("shared_with_users", people),
        ("shared_with_teams", teams),
        ("maintainer_users", people),
        ("maintainer_teams", teams),
    ):
        form.fields[name] = forms.MultipleChoiceField(
            choices=choices,
            required=False,
            widget=forms.CheckboxSelectMultiple,
            label=name.replace("_", " ").capitalize(),
        )


class _SharingForm(forms.Form):
    visibility = forms.ChoiceField(choices=Visibility.choices, initial=Visibility.ORGANIZATION)

    def __init__(self, *args: Any, principal: Principal, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _pickers(self, principal)


class SkillForm(_SharingForm):
    """The skill as separate fields; or, with ``raw``, as one SKILL.md text."""

    name = forms.CharField(max_length=skillmd.NAME_MAX, strip=False)
    description = forms.CharField(max_length=skillmd.DESCRIPTION_MAX, strip=False)
    content = forms.CharField(widget=forms.Textarea(attrs={"rows": 18}), max_length=skillmd.CONTENT_MAX, strip=False)
    markdown = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24}), max_length=skillmd.MARKDOWN_MAX, strip=False, required=False
    )
    collection = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, principal: Principal, raw: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, principal=principal, **kwargs)
        collections = selectors.readable_collections(principal).order_by("name")
        _set_choices(self.fields["collection"], [(ROOT, "— root —"), *((c.pk, c.name) for c in collections)])
        self.raw = raw
        if raw:
            for name in ("name", "description", "content"):
                del self.fields[name]
            self.fields["markdown"].required = True
        else:
            del self.fields["markdown"]


class CollectionForm(_SharingForm):
    name = forms.CharField(max_length=skillmd.NAME_MAX, strip=False)
    description = forms.CharField(max_length=skillmd.COLLECTION_DESCRIPTION_MAX, strip=False, required=False)


class FilterForm(forms.Form):
    q = forms.CharField(required=False, label="Text")
    visibility = forms.ChoiceField(choices=[("", "any"), *Visibility.choices], required=False)
    collection = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, principal: Principal, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        collections = selectors.readable_collections(principal).order_by("name")
        _set_choices(
            self.fields["collection"], [("", "any"), ("root", "root only"), *((c.pk, c.name) for c in collections)]
        )
