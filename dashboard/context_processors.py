"""Navigation: an area appears once its dashboard page exists (its URL name resolves)."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

# (label, URL name). Each area names its landing page with the URL name listed here.
AREAS = [
    ("Overview", "home"),
    ("Sandboxes", "dashboard-sandboxes"),
    ("Skills", "dashboard-skills"),
    ("Collections", "dashboard-collections"),
    ("Tools", "dashboard-tools"),
    ("Access tokens", "tokens"),
]


def navigation(request: HttpRequest) -> dict[str, object]:
    items = []
    for label, name in AREAS:
        try:
            url = reverse(name)
        except NoReverseMatch:
            continue
        active = request.path == url if url == "/" else request.path.startswith(url)
        items.append({"label": label, "url": url, "active": active})
    return {"nav_items": items}
