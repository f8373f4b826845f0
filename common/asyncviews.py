"""Plain async views under /api/ (streaming endpoints DRF cannot serve without holding a thread).

The decorator gives them what DRF gives the others: method check, CSRF exemption (bearer auth, no
cookies), and the JSON error shape for ApiError, validation errors and oversized bodies.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers

from common.errors import ApiError, error_response, flatten_validation

AsyncView = Callable[..., Awaitable[HttpResponseBase]]


def api_async_view(*methods: str) -> Callable[[AsyncView], AsyncView]:
    allowed = {m.upper() for m in methods}

    def decorate(view: AsyncView) -> AsyncView:
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method not in allowed:
                response = error_response(405, "method_not_allowed", f'Method "{request.method}" not allowed.')
                response["Allow"] = ", ".join(sorted(allowed))
                return response
            try:
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status_code, exc.code, exc.message, exc.details)
            except serializers.ValidationError as exc:
                fields = flatten_validation(exc.detail)
                if not isinstance(fields, dict):
                    fields = {"nonFieldErrors": fields}
                return error_response(400, "validation_error", "Request is invalid.", {"fields": fields})
            except RequestDataTooBig:
                return error_response(413, "payload_too_large", "Request body is too large.")

        return csrf_exempt(wrapper)  # type: ignore[return-value]

    return decorate
