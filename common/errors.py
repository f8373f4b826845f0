"""One error shape for every API response: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error with a stable machine-readable code, raised from services and views alike."""

    def __init__(self, *, status_code: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details or {}


def not_found(what: str = "Object") -> ApiError:
    return ApiError(status_code=404, code="not_found", message=f"{what} not found.")


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(status_code: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    response = JsonResponse(error_body(code, message, details), status=status_code)
    if status_code == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def flatten_validation(detail: Any) -> dict[str, Any]:
    """Turn DRF's nested error lists into {field: [messages]} (nested fields keep their nesting)."""
    if isinstance(detail, dict):
        return {str(key): flatten_validation(value) for key, value in detail.items()}
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return [str(item) for item in detail]  # type: ignore[return-value]
        return [flatten_validation(item) for item in detail]  # type: ignore[return-value]
    return [str(detail)]  # type: ignore[return-value]


_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "rate_limited",
    exceptions.ParseError: "malformed_request",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = ApiError(status_code=413, code="payload_too_large", message="Request body is too large.")

    # Imported here: rest_framework.views imports the authentication classes, which import this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is None:
        return None

    if isinstance(exc, ApiError):
        body = error_body(exc.code, exc.message, exc.details)
    elif isinstance(exc, exceptions.ValidationError):
        details = flatten_validation(exc.detail)
        if not isinstance(details, dict):
            details = {"nonFieldErrors": details}
        body = error_body("validation_error", "Request is invalid.", {"fields": details})
    else:
        assert isinstance(exc, exceptions.APIException)
        code = _CODES.get(type(exc))
        if code is None:
            # Subclasses (e.g. ReadOnlyToken) and custom exceptions carry their own code.
            detail_code = getattr(exc.detail, "code", None)
            inherited = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
            code = detail_code if isinstance(detail_code, str) else inherited
        extra: dict[str, Any] = {}
        wait = getattr(exc, "wait", None)
        if isinstance(exc, exceptions.Throttled) and wait is not None:
            extra["retryAfterSeconds"] = int(wait)
        body = error_body(code, str(exc.detail), extra)

    response.data = body
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response
