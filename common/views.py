from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from common.health import run_checks


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    results = run_checks()
    ok = all(result.ok for result in results.values())
    body = {
        "status": "ok" if ok else "unavailable",
        "checks": {name: {"ok": result.ok, **result.detail} for name, result in results.items()},
    }
    return JsonResponse(body, status=200 if ok else 503)
