"""The admin: every model of the service is registered, and its pages load for staff."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db.models import Model
from django.test import Client
from django.urls import reverse

from accounts.models import User
from tests.conftest import Actor

SERVICE_APPS = {"accounts", "audit", "sandboxes", "skills", "toolapi"}


def _service_models() -> list[type[Model]]:
    return [model for model in apps.get_models() if model._meta.app_label in SERVICE_APPS]


def test_every_model_is_registered() -> None:
    missing = [model.__name__ for model in _service_models() if model not in admin.site._registry]
    assert missing == []


@pytest.mark.django_db
def test_every_changelist_loads_with_search(owner: Actor) -> None:
    staff = User.objects.create_superuser("root@acme.test", "pw-123456")
    client = Client()
    client.force_login(staff)
    for model in _service_models():
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        response = client.get(url, {"q": "acme"})
        assert response.status_code == 200, url
        model_admin = admin.site._registry[model]
        assert model_admin.list_display != ("__str__",), f"{meta.label} has no list columns"
        assert model_admin.search_fields, f"{meta.label} has no search"
