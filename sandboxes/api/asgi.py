"""Creates, exec, read-file and write-file served straight from ASGI (common.fastpath).

An exec of `true` is a millisecond of real work in the sandbox; under Django's request cycle most
of its round trip went to the sync middleware around the view. The views are the same
(sandboxes.api.streaming) for the same URLs; they need nothing from the request cycle: their
database work runs in worker threads, as it does under Django.

A create (POST /api/v1/sandboxes) with a warm pool is a few milliseconds of work, and the request
cycle around DRF's view (middleware thread hops, content negotiation) took as long again: it is
served here too, by the same service function and serializer, with the same rate limit. Listing
(GET on the same URL) stays with DRF.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from audit.services import client_address
from common.asyncviews import api_async_view
from common.errors import error_response
from common.fastpath import Routes, View
from common.permissions import require_writable
from common.principal import Principal
from common.throttling import api_request_allowed
from sandboxes import services
from sandboxes.api import streaming
from sandboxes.api.serializers import SandboxSerializer

COLLECTION = "/api/v1/sandboxes"
PREFIX = "/api/v1/sandboxes/"


def _create(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    # Outside Django's request cycle nothing else releases the thread's connection when it is stale.
    close_old_connections()
    try:
        allowed, wait = api_request_allowed(request)
        if not allowed:
            message = "Request was throttled." + (f" Expected available in {wait} seconds." if wait else "")
            response = error_response(429, "rate_limited", message, {"retryAfterSeconds": wait} if wait else None)
            if wait:
                response["Retry-After"] = str(wait)
            return response
        sandbox = services.create_sandbox(principal=principal, address=client_address(request))
        data: dict[str, Any] = SandboxSerializer(sandbox).data
        return JsonResponse(data, status=201)
    finally:
        close_old_connections()


_acreate = sync_to_async(_create, thread_sensitive=False)


@api_async_view("POST")
async def _create_view(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    require_writable(principal)
    return await _acreate(request, principal)


async def create_view(request: HttpRequest) -> HttpResponseBase:
    response = await _create_view(request)
    # What DRF's view adds to every answer of this URL, errors included.
    response["Allow"] = "GET, POST, HEAD, OPTIONS"
    return response


_VIEWS: dict[str, View] = {
    "exec": streaming.exec_view,
    "read-file": streaming.read_file_view,
    "write-file": streaming.write_file_view,
}


def route(path_info: str) -> tuple[View, dict[str, str]] | None:
    """The view and arguments Django's URLconf (sandboxes.api.urls) gives ``path_info``, for the streams."""
    if not path_info.startswith(PREFIX):
        return None
    sandbox_id, slash, action = path_info[len(PREFIX) :].partition("/")
    view = _VIEWS.get(action)
    if not sandbox_id or not slash or view is None:
        return None
    return view, {"sandbox_id": sandbox_id}


class SandboxStreamRoutes(Routes):
    name = "sandbox streams"

    def route(self, path_info: str) -> tuple[View, dict[str, str]] | None:
        return route(path_info)

    def route_request(self, method: str, path_info: str) -> tuple[View, dict[str, str]] | None:
        if path_info == COLLECTION:
            return (create_view, {}) if method == "POST" else None
        return route(path_info)
