"""POST /api/v1/auth/token-exchange (RFC 8693). Errors use RFC 6749's body, as OAuth clients expect."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from accounts import oidc, services
from common.throttling import exchange_allowed

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105 - a URN, not a secret
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a URN


def _oauth_error(error: str, description: str, status: int = 400) -> JsonResponse:
    response = JsonResponse({"error": error, "error_description": description}, status=status)
    # RFC 6749 section 5.1/5.2: token responses are never cached.
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
@require_POST
def token_exchange(request: HttpRequest) -> JsonResponse:
    allowed, wait = exchange_allowed(request)
    if not allowed:
        response = _oauth_error("rate_limited", "Too many token exchanges from this address; retry later.", 429)
        if wait is not None:
            response["Retry-After"] = str(wait)
        return response
    if not request.content_type or request.content_type != "application/x-www-form-urlencoded":
        return _oauth_error("invalid_request", "Content-Type must be application/x-www-form-urlencoded")
    grant_type = request.POST.get("grant_type", "")
    if grant_type != GRANT_TYPE:
        return _oauth_error("unsupported_grant_type", f"grant_type must be {GRANT_TYPE}")
    subject_token = request.POST.get("subject_token", "")
    subject_token_type = request.POST.get("subject_token_type", "")
    if not subject_token:
        return _oauth_error("invalid_request", "subject_token is required")
    if subject_token_type not in (JWT_TYPE, ID_TOKEN_TYPE):
        return _oauth_error("invalid_request", f"subject_token_type must be {JWT_TYPE}")
    requested = request.POST.get("requested_token_type")
    if requested and requested != ACCESS_TOKEN_TYPE:
        return _oauth_error("invalid_request", f"requested_token_type must be {ACCESS_TOKEN_TYPE}")
    try:
        issued = services.exchange_identity_token(subject_token=subject_token)
    except oidc.IdentityTokenError as exc:
        return _oauth_error("invalid_grant", str(exc))
    response = JsonResponse(
        {
            "access_token": issued.raw,
            "issued_token_type": ACCESS_TOKEN_TYPE,
            "token_type": "Bearer",
            "expires_in": settings.SANDBOX_API_TOKEN_SECONDS,
        }
    )
    response["Cache-Control"] = "no-store"
    return response


def openid_configuration(request: HttpRequest) -> JsonResponse:
    return JsonResponse(oidc.openid_configuration())


def jwks(request: HttpRequest) -> JsonResponse:
    response = JsonResponse(oidc.jwks())
    response["Cache-Control"] = "public, max-age=300"
    return response
