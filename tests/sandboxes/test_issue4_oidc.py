"""Identity tokens for live sandboxes: signing-key rotation, and a trusted external issuer whose keys
are fetched from its JWKS URI (a real HTTP server on loopback)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.test import Client
from jwt.algorithms import ECAlgorithm

from accounts.models import ApiToken, hash_token
from sandboxes import credentials
from sandboxes.models import Sandbox

pytestmark = pytest.mark.django_db(transaction=True)

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"

# Each exchange comes from its own address, so the per-address exchange rate limit (shared through the
# cache with every other test) never decides an answer here.
_addresses = count(1)


def _exchange(token: str) -> Any:
    body = urlencode({"grant_type": GRANT, "subject_token": token, "subject_token_type": JWT_TYPE})
    n = next(_addresses)
    client = Client(REMOTE_ADDR=f"10.44.{n // 250}.{n % 250 + 1}")
    return client.post("/api/v1/auth/token-exchange", body, content_type="application/x-www-form-urlencoded")


def _refused(response: Any) -> str:
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_grant"
    return str(response.json()["error_description"])


def _pem_file(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return str(path)


def _live_tokens(sandbox_id: str) -> int:
    return ApiToken.objects.filter(sandbox_id=sandbox_id, revoked_at__isnull=True).count()


def _reads_as_sandbox(api: httpx.Client, raw: str) -> None:
    """The issued token works against the live server, read-only."""
    headers = {"Authorization": f"Bearer {raw}"}
    me = api.get("/api/v1/me", headers=headers)
    assert me.status_code == 200, me.text
    assert me.json()["tokenReadOnly"] is True
    denied = api.patch("/api/v1/organization", json={"name": "x"}, headers=headers)
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "read_only_token"


# -- rotation of this service's own signing keys ---------------------------------------------------


def test_a_token_signed_by_the_previous_key_is_accepted_after_rotation(
    api: httpx.Client, sandbox_id: str, settings: Any, tmp_path: Path
) -> None:
    old = _pem_file(tmp_path / "old.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    new = _pem_file(tmp_path / "new.pem", ec.generate_private_key(ec.SECP256R1()))
    sandbox = Sandbox.objects.select_related("organization").get(pk=sandbox_id)

    settings.OIDC_SIGNING_KEY_FILES = [old]
    issued_before = credentials.identity_token(sandbox)
    old_kid = jwt.get_unverified_header(issued_before)["kid"]

    # Rotation: the new key is prepended and signs from now on; the old one is still published.
    settings.OIDC_SIGNING_KEY_FILES = [new, old]
    published = Client().get("/.well-known/jwks.json").json()["keys"]
    issued_after = credentials.identity_token(sandbox)
    new_kid = jwt.get_unverified_header(issued_after)["kid"]
    assert new_kid != old_kid
    assert [key["kid"] for key in published] == [new_kid, old_kid]
    assert [key["alg"] for key in published] == ["ES256", "RS256"]
    assert all("d" not in key for key in published), "never publish private material"
    discovery = Client().get("/.well-known/openid-configuration").json()
    assert discovery["id_token_signing_alg_values_supported"] == ["ES256", "RS256"]
    # Anyone verifying with the published set alone accepts both.
    keys = {key["kid"]: jwt.PyJWK(key) for key in published}
    for token in (issued_before, issued_after):
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, keys[header["kid"]].key, algorithms=[header["alg"]], audience=settings.OIDC_AUDIENCE)
        assert claims["sandbox_id"] == sandbox_id

    for token in (issued_before, issued_after):
        response = _exchange(token)
        assert response.status_code == 200, response.content
        raw = response.json()["access_token"]
        assert ApiToken.objects.get(token_hash=hash_token(raw)).sandbox_id == sandbox_id
        _reads_as_sandbox(api, raw)

    # Once the old key is retired, what it signed is refused.
    settings.OIDC_SIGNING_KEY_FILES = [new]
    tokens = _live_tokens(sandbox_id)
    assert _refused(_exchange(issued_before)) == "unknown key id"
    assert _live_tokens(sandbox_id) == tokens
    assert [key["kid"] for key in Client().get("/.well-known/jwks.json").json()["keys"]] == [new_kid]


# -- a trusted external issuer ----------------------------------------------------------------------


@dataclass
class ExternalIssuer:
    """An OIDC issuer of its own (as a Kubernetes service-account issuer is), serving its JWKS."""

    url: str
    key: ec.EllipticCurvePrivateKey
    kid: str
    served: dict[str, Any]
    fetches: list[str] = field(default_factory=list)

    @property
    def jwks_uri(self) -> str:
        return f"{self.url}/openid/v1/jwks"

    @property
    def config(self) -> dict[str, str]:
        return {"issuer": self.url, "jwksUri": self.jwks_uri, "audience": "svc-cluster"}

    def publish(self, *keys: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
        self.served["keys"] = [_public_jwk(key, kid) for key, kid in keys]

    def token(
        self,
        sandbox: Sandbox,
        *,
        key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
        kid: str | None = None,
        algorithm: str = "ES256",
        **claims: Any,
    ) -> str:
        now = int(time.time())
        payload = {
            "iss": self.url,
            "aud": "svc-cluster",
            "sub": f"system:serviceaccount:sandboxes:{sandbox.pk}",
            "iat": now,
            "nbf": now,
            "exp": now + 120,
            "sandbox_id": sandbox.pk,
            "org": sandbox.organization_id,
            "creator": sandbox.created_by_id,
            **claims,
        }
        return jwt.encode(payload, key or self.key, algorithm=algorithm, headers={"kid": kid or self.kid})


def _public_jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": "ES256", "use": "sig"})
    return jwk


@pytest.fixture
def issuer() -> Iterator[ExternalIssuer]:
    served: dict[str, Any] = {"keys": []}
    fetches: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetches.append(self.path)
            if self.path != "/openid/v1/jwks":
                self.send_error(404)
                return
            body = json.dumps(served).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    key = ec.generate_private_key(ec.SECP256R1())
    found = ExternalIssuer(
        url=f"http://127.0.0.1:{server.server_address[1]}", key=key, kid="cluster-1", served=served, fetches=fetches
    )
    found.publish((key, "cluster-1"))
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_trusted_issuers_token_buys_credentials_for_a_live_sandbox(
    api: httpx.Client, sandbox_id: str, issuer: ExternalIssuer, settings: Any
) -> None:
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    token = issuer.token(sandbox)
    # Not trusted until configured.
    assert _refused(_exchange(token)) == "issuer is not trusted"

    settings.OIDC_TRUSTED_ISSUERS = [issuer.config]
    response = _exchange(token)
    assert response.status_code == 200, response.content
    assert issuer.fetches == ["/openid/v1/jwks"], "the keys come from the issuer's JWKS URI"
    raw = response.json()["access_token"]
    issued = ApiToken.objects.get(token_hash=hash_token(raw))
    assert issued.sandbox_id == sandbox_id and issued.read_only
    _reads_as_sandbox(api, raw)

    # The credentials die with the sandbox, and the issuer's token no longer buys new ones.
    assert api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 401
    assert _refused(_exchange(issuer.token(sandbox))) == "the subject is unknown or no longer exists"


def test_a_trusted_issuers_forged_or_mismatched_tokens_are_refused(
    api: httpx.Client, sandbox_id: str, issuer: ExternalIssuer, settings: Any
) -> None:
    settings.OIDC_TRUSTED_ISSUERS = [issuer.config]
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    tokens = _live_tokens(sandbox_id)
    attacker = ec.generate_private_key(ec.SECP256R1())

    # Signed by another key under the issuer's published kid: the signature does not verify.
    assert "Signature verification failed" in _refused(_exchange(issuer.token(sandbox, key=attacker)))
    # A kid the issuer never published (even when the issuer's own key signed it).
    assert _refused(_exchange(issuer.token(sandbox, kid="cluster-9"))) == "unknown key id"
    assert _refused(_exchange(issuer.token(sandbox, key=attacker, kid="cluster-9"))) == "unknown key id"
    # A header naming another algorithm than the published key's.
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert "does not match" in _refused(_exchange(issuer.token(sandbox, key=rsa_key, algorithm="RS256")))
    # This issuer's tokens must name the audience configured for it, not this service's default one.
    assert _refused(_exchange(issuer.token(sandbox, aud=settings.OIDC_AUDIENCE))) == (
        "subject_token has the wrong audience"
    )
    assert _refused(_exchange(issuer.token(sandbox, exp=int(time.time()) - 60))) == "subject_token has expired"
    assert _live_tokens(sandbox_id) == tokens, "no refused exchange issued anything"
    # The genuine token still works, so the refusals above were about the tokens, not the set-up.
    assert _exchange(issuer.token(sandbox)).status_code == 200


def test_a_key_the_trusted_issuer_removes_stops_being_accepted(
    api: httpx.Client, sandbox_id: str, issuer: ExternalIssuer, settings: Any
) -> None:
    settings.OIDC_TRUSTED_ISSUERS = [issuer.config]
    settings.OIDC_TRUSTED_JWKS_CACHE_SECONDS = 1
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    assert _exchange(issuer.token(sandbox)).status_code == 200

    # The issuer rotates: a new key is published and the old one withdrawn (say, it leaked).
    replacement = ec.generate_private_key(ec.SECP256R1())
    issuer.publish((replacement, "cluster-2"))
    time.sleep(1.5)
    assert _refused(_exchange(issuer.token(sandbox))) == "unknown key id"
    assert _exchange(issuer.token(sandbox, key=replacement, kid="cluster-2")).status_code == 200
