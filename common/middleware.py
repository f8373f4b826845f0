"""Keep /api/ free of HTML: Django-level errors (unknown URL, crash, oversized body) become JSON."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from common.errors import ApiError, error_response

logger = logging.getLogger(__name__)

_STATUS_CODES = {
    400: ("bad_request", "The request is malformed."),
    401: ("not_authenticated", "Authentication credentials were not provided."),
    403: ("permission_denied", "You do not have permission to do this."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "Method not allowed."),
    413: ("payload_too_large", "Request body is too large."),
    500: ("internal_error", "Internal server error."),
}


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def jsonify_error(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """An error response on /api/ that is not JSON (Django's own 404, 405, ...) as the JSON error body."""
    if not _is_api(request) or response.status_code < 400 or response.streaming:
        return response
    content_type = response.get("Content-Type", "")
    if content_type.startswith("application/json") or content_type.startswith("application/problem"):
        return response
    data = getattr(response, "data", None)
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        # A DRF view with an HTML renderer (Swagger UI) already built the error body: keep its code.
        error = data["error"]
        replacement = error_response(response.status_code, error["code"], error["message"], error.get("details"))
    else:
        code, message = _STATUS_CODES.get(response.status_code, ("error", "Request failed."))
        replacement = error_response(response.status_code, code, message)
    if response.has_header("Allow"):
        replacement["Allow"] = response["Allow"]
    return replacement


def _exception_response(request: HttpRequest, exc: Exception) -> HttpResponse | None:
    if not _is_api(request):
        return None
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, exc.code, exc.message, exc.details)
    if isinstance(exc, RequestDataTooBig):
        return error_response(413, "payload_too_large", "Request body is too large.")
    logger.exception("Unhandled error on %s %s", request.method, request.path)
    return error_response(500, "internal_error", "Internal server error.")


class ApiErrorMiddleware:
    async_capable = True
    sync_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return jsonify_error(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return jsonify_error(request, await response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return _exception_response(request, exception)
