"""Plain async views under /api/ (streaming endpoints DRF cannot serve without holding a thread).

The decorator gives them what DRF gives the others: bearer authentication (the view receives the
Principal), method check, CSRF exemption (bearer auth, no cookies), and the JSON error shape for ApiError, validation errors and oversized bodies.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers

from common.auth import bearer_from_header, cached_principal, principal_for_request_cached
from common.errors import ApiError, error_response, flatten_validation
from common.principal import Principal

AsyncView = Callable[..., Awaitable[HttpResponseBase]]

_resolve = sync_to_async(principal_for_request_cached, thread_sensitive=False)


async def authenticate(request: HttpRequest) -> Principal:
    """The caller, from the short-lived principal cache without a thread hop when possible."""
    raw = bearer_from_header(request.headers.get("Authorization"))
    if raw:
        hit = cached_principal(raw)
        if hit is not None:
            return hit
    return await _resolve(request)


def api_async_view(*methods: str) -> Callable[[AsyncView], AsyncView]:
    allowed = {m.upper() for m in methods}

    def decorate(view: AsyncView) -> AsyncView:
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                # Authentication comes first, as in DRF: an anonymous caller learns nothing (not even
                # which methods exist) before it is told 401.
                principal = await authenticate(request)
                if request.method not in allowed:
                    response = error_response(405, "method_not_allowed", f'Method "{request.method}" not allowed.')
                    response["Allow"] = ", ".join(sorted(allowed))
                    return response
                return await view(request, principal, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status_code, exc.code, exc.message, exc.details)
            except serializers.ValidationError as exc:
                fields = flatten_validation(exc.detail)
                if not isinstance(fields, dict):
                    fields = {"nonFieldErrors": fields}
                return error_response(400, "validation_error", "Request is invalid.", {"fields": fields})
            except RequestDataTooBig:
                return error_response(413, "payload_too_large", "Request body is too large.")

        return csrf_exempt(wrapper)

    return decorate
