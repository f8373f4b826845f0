"""URL map. Apps for later capabilities add their API includes to API_V1 and ROOT lists below."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from common.views import healthz


def _exists(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:
        return False


api_v1: list[Any] = [
    path("", include("accounts.api.urls")),
    path("schema", SpectacularAPIView.as_view(), name="schema"),
]
# Each capability owns an `api/urls.py` mounted under /api/v1/ once it exists.
for _app in ("sandboxes", "audit", "skills", "toolapi"):
    if _exists(f"{_app}.api.urls"):
        api_v1.append(path("", include(f"{_app}.api.urls")))

urlpatterns: list[Any] = [
    path("api/v1/", include(api_v1)),
    path("api/docs", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("", include("accounts.root_urls")),
    path("admin/", admin.site.urls),
    path("", include("dashboard.urls")),
]
# Areas with their own non-/api/v1 routes (the tool HTTP API, OIDC discovery) expose `root_urls`.
for _app in ("sandboxes", "toolapi", "skills"):
    if _exists(f"{_app}.root_urls"):
        urlpatterns.insert(0, path("", include(f"{_app}.root_urls")))
