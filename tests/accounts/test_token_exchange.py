"""RFC 8693 token exchange and the attacks it must refuse."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.test import Client

from accounts import oidc
from accounts.models import ApiToken
from tests.conftest import Actor

pytestmark = pytest.mark.django_db

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"

# Sandboxes that exist, as the sandboxes app would answer: sandbox id -> (organization id, user id).
LIVE: dict[str, tuple[str, str]] = {}


def _resolver(claims: dict[str, Any]) -> oidc.ExchangeSubject | None:
    entry = LIVE.get(str(claims.get("sandbox_id")))
    if entry is None or entry[0] != claims.get("org"):
        return None
    return oidc.ExchangeSubject(user_id=entry[1], organization_id=entry[0], sandbox_id=str(claims["sandbox_id"]))


@pytest.fixture(autouse=True)
def live_sandbox(owner: Actor) -> Iterator[str]:
    oidc.register_subject_resolver(_resolver)
    LIVE.clear()
    LIVE["sbx_one"] = (owner.organization.pk, owner.user.pk)
    yield "sbx_one"
    LIVE.clear()


def _claims(owner: Actor, **extra: Any) -> dict[str, Any]:
    return {"sandbox_id": "sbx_one", "org": owner.organization.pk, "creator": owner.user.pk, **extra}


def _valid_payload(owner: Actor) -> dict[str, Any]:
    """Claims the exchange would accept, for attacks that only change the signature or header."""
    now = int(time.time())
    return {
        "iss": settings.OIDC_ISSUER,
        "aud": settings.OIDC_AUDIENCE,
        "sub": "x",
        "iat": now,
        "exp": now + 60,
        **_claims(owner),
    }


def _exchange(token: str, **overrides: str) -> Any:
    data = {"grant_type": GRANT, "subject_token": token, "subject_token_type": JWT_TYPE, **overrides}
    return Client().post(
        "/api/v1/auth/token-exchange", urlencode(data), content_type="application/x-www-form-urlencoded"
    )


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def test_discovery_and_jwks() -> None:
    config = Client().get("/.well-known/openid-configuration").json()
    assert config["issuer"] == settings.OIDC_ISSUER
    keys = Client().get("/.well-known/jwks.json").json()["keys"]
    assert keys and all("d" not in key for key in keys), "never publish private material"
    assert keys[0]["kid"] == oidc.signing_keys()[0].kid


def test_exchange_gives_a_read_only_sandbox_token(owner: Actor) -> None:
    identity = oidc.issue_identity_token(subject="sandbox:sbx_one", claims=_claims(owner))
    response = _exchange(identity)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    assert body["expires_in"] == settings.SANDBOX_API_TOKEN_SECONDS
    assert response["Cache-Control"] == "no-store"
    api = Client(headers={"Authorization": f"Bearer {body['access_token']}"})
    me = api.get("/api/v1/me").json()
    assert me["user"]["id"] == owner.user.pk and me["tokenReadOnly"] is True
    denied = api.patch("/api/v1/organization", {"name": "x"}, content_type="application/json")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "read_only_token"
    token = ApiToken.objects.get(sandbox_id="sbx_one")
    assert token.read_only and token.expires_at is not None


def test_identity_token_verifies_with_the_published_jwks(owner: Actor) -> None:
    identity = oidc.issue_identity_token(subject="sandbox:sbx_one", claims=_claims(owner))
    jwk = Client().get("/.well-known/jwks.json").json()["keys"][0]
    key = jwt.PyJWK(jwk)
    claims = jwt.decode(identity, key.key, algorithms=["ES256"], audience=settings.OIDC_AUDIENCE)
    assert claims["sandbox_id"] == "sbx_one"


def _assert_invalid_grant(response: Any) -> None:
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_grant"
    assert response.json()["error_description"]
    assert not ApiToken.objects.filter(sandbox_id="sbx_one").exists()


def test_alg_none_is_refused(owner: Actor) -> None:
    payload = _valid_payload(owner)
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': oidc.signing_keys()[0].kid})}.{_b64(payload)}."
    _assert_invalid_grant(_exchange(unsigned))


def test_hs256_signed_with_the_public_key_is_refused(owner: Actor) -> None:
    payload = _valid_payload(owner)
    public_pem = json.dumps(Client().get("/.well-known/jwks.json").json()["keys"][0]).encode()
    header = {"alg": "HS256", "typ": "JWT", "kid": oidc.signing_keys()[0].kid}
    signing_input = f"{_b64(header)}.{_b64(payload)}".encode()
    signature = (
        base64.urlsafe_b64encode(hmac.new(public_pem, signing_input, hashlib.sha256).digest()).decode().rstrip("=")
    )
    _assert_invalid_grant(_exchange(f"{signing_input.decode()}.{signature}"))


def test_wrong_kid_is_refused(owner: Actor) -> None:
    key = oidc.signing_keys()[0]
    payload = _valid_payload(owner)
    token = jwt.encode(payload, key.private_key, algorithm="ES256", headers={"kid": "someone-elses"})
    _assert_invalid_grant(_exchange(token))


def test_a_foreign_key_with_our_kid_is_refused(owner: Actor) -> None:
    attacker = ec.generate_private_key(ec.SECP256R1())
    payload = _valid_payload(owner)
    token = jwt.encode(payload, attacker, algorithm="ES256", headers={"kid": oidc.signing_keys()[0].kid})
    _assert_invalid_grant(_exchange(token))


def test_expired_is_refused(owner: Actor) -> None:
    token = oidc.issue_identity_token(
        subject="x", claims=_claims(owner, iat=int(time.time()) - 600, exp=int(time.time()) - 60)
    )
    _assert_invalid_grant(_exchange(token))


def test_wrong_audience_is_refused(owner: Actor) -> None:
    token = oidc.issue_identity_token(subject="x", claims=_claims(owner, aud="someone-else"))
    _assert_invalid_grant(_exchange(token))


def test_unknown_issuer_is_refused(owner: Actor) -> None:
    token = oidc.issue_identity_token(subject="x", claims=_claims(owner, iss="https://evil.example"))
    _assert_invalid_grant(_exchange(token))


def test_another_organizations_sandbox_is_refused(owner: Actor, outsider: Actor) -> None:
    # The token names our sandbox but claims the outsider's organization.
    token = oidc.issue_identity_token(subject="x", claims=_claims(owner, org=outsider.organization.pk))
    _assert_invalid_grant(_exchange(token))


def test_destroyed_sandbox_is_refused(owner: Actor) -> None:
    token = oidc.issue_identity_token(subject="x", claims=_claims(owner))
    LIVE.clear()
    _assert_invalid_grant(_exchange(token))


def test_malformed_requests(owner: Actor) -> None:
    identity = oidc.issue_identity_token(subject="x", claims=_claims(owner))
    assert _exchange(identity, grant_type="password").json()["error"] == "unsupported_grant_type"
    assert _exchange(identity, subject_token_type="urn:x").json()["error"] == "invalid_request"
    assert _exchange("").json()["error"] == "invalid_request"
    assert _exchange("not.a.jwt").json()["error"] == "invalid_grant"
    as_json = Client().post("/api/v1/auth/token-exchange", {"grant_type": GRANT}, content_type="application/json")
    assert as_json.status_code == 400 and as_json.json()["error"] == "invalid_request"
    assert Client().get("/api/v1/auth/token-exchange").status_code == 405


def test_tokens_die_with_their_sandbox(owner: Actor) -> None:
    from accounts import services

    body = _exchange(oidc.issue_identity_token(subject="x", claims=_claims(owner))).json()
    assert services.revoke_sandbox_tokens(sandbox_id="sbx_one") == 1
    assert Client(headers={"Authorization": f"Bearer {body['access_token']}"}).get("/api/v1/me").status_code == 401
