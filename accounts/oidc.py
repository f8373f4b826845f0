"""OIDC identity for sandboxes: issuing identity tokens, publishing keys, and verifying tokens for the
RFC 8693 token exchange.

The service is an issuer for its local runtime's sandboxes; other issuers (a Kubernetes cluster's
service-account issuer) are configuration, so trusting them needs no code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.conf import settings
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from common.ids import new_id

# Only asymmetric algorithms: a symmetric one would let anyone holding the public key forge tokens.
ALLOWED_ALGORITHMS = ["ES256", "RS256"]


@dataclass(frozen=True)
class SigningKey:
    kid: str
    algorithm: str
    private_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    public_jwk: dict[str, Any]


def _generate_key_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def _load_key(path: Path) -> SigningKey:
    private_key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        algorithm = "ES256"
        jwk = json.loads(ECAlgorithm.to_jwk(private_key.public_key()))
    elif isinstance(private_key, rsa.RSAPrivateKey):
        algorithm = "RS256"
        jwk = json.loads(RSAAlgorithm.to_jwk(private_key.public_key()))
    else:
        raise ValueError(f"{path}: only EC P-256 and RSA signing keys are supported")
    # The RFC 7638 thumbprint names the key, so a kid never collides across rotations.
    kid = _thumbprint(jwk)
    jwk.update({"kid": kid, "alg": algorithm, "use": "sig"})
    return SigningKey(kid=kid, algorithm=algorithm, private_key=private_key, public_jwk=jwk)


def _thumbprint(jwk: dict[str, Any]) -> str:
    members = {k: jwk[k] for k in (("crv", "kty", "x", "y") if jwk["kty"] == "EC" else ("e", "kty", "n"))}
    digest = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@cache
def signing_keys() -> tuple[SigningKey, ...]:
    files = [Path(p) for p in settings.OIDC_SIGNING_KEY_FILES]
    if not files:
        generated = Path(settings.OIDC_GENERATED_KEY_FILE)
        if not generated.exists():
            _generate_key_file(generated)
        files = [generated]
    return tuple(_load_key(path) for path in files)


def jwks() -> dict[str, Any]:
    return {"keys": [key.public_jwk for key in signing_keys()]}


def openid_configuration() -> dict[str, Any]:
    issuer = settings.OIDC_ISSUER
    return {
        "issuer": issuer,
        "jwks_uri": f"{issuer}/.well-known/jwks.json",
        "token_endpoint": f"{settings.BASE_URL}/api/v1/auth/token-exchange",
        "grant_types_supported": ["urn:ietf:params:oauth:grant-type:token-exchange"],
        "id_token_signing_alg_values_supported": sorted({k.algorithm for k in signing_keys()}),
        "subject_types_supported": ["public"],
        "response_types_supported": ["id_token"],
    }


def issue_identity_token(*, subject: str, claims: dict[str, Any], lifetime: int | None = None) -> str:
    """Sign an identity token with the current key; handed to a sandbox by its runtime at start."""
    key = signing_keys()[0]
    now = int(time.time())
    payload = {
        "iss": settings.OIDC_ISSUER,
        "aud": settings.OIDC_AUDIENCE,
        "sub": subject,
        "iat": now,
        "nbf": now,
        "exp": now + (lifetime or settings.SANDBOX_IDENTITY_TOKEN_SECONDS),
        "jti": new_id("jti"),
        **claims,
    }
    return jwt.encode(payload, key.private_key, algorithm=key.algorithm, headers={"kid": key.kid})


class IdentityTokenError(Exception):
    """The subject token is not acceptable; the message is safe to show the caller."""


@cache
def _remote_jwks_client(jwks_uri: str) -> jwt.PyJWKClient:
    return jwt.PyJWKClient(jwks_uri, cache_keys=True, lifespan=300, timeout=5)


def _trusted_issuers() -> dict[str, dict[str, str]]:
    issuers = {item["issuer"].rstrip("/"): item for item in settings.OIDC_TRUSTED_ISSUERS}
    issuers[settings.OIDC_ISSUER] = {"issuer": settings.OIDC_ISSUER, "audience": settings.OIDC_AUDIENCE}
    return issuers


def verify_identity_token(token: str) -> dict[str, Any]:
    """Verify signature, issuer, audience and lifetime; return the claims."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise IdentityTokenError("subject_token is not a well-formed JWT") from exc
    algorithm = header.get("alg")
    if algorithm not in ALLOWED_ALGORITHMS:
        raise IdentityTokenError(f"alg {algorithm!r} is not accepted")
    issuer = str(unverified.get("iss", "")).rstrip("/")
    trusted = _trusted_issuers().get(issuer)
    if trusted is None:
        raise IdentityTokenError("issuer is not trusted")
    kid = header.get("kid")
    if issuer == settings.OIDC_ISSUER:
        key = next((k for k in signing_keys() if k.kid == kid), None)
        if key is None:
            raise IdentityTokenError("unknown key id")
        verification_key: Any = key.private_key.public_key()
        expected_alg = key.algorithm
    else:
        try:
            signing = _remote_jwks_client(trusted["jwksUri"]).get_signing_key_from_jwt(token)
        except jwt.PyJWTError as exc:
            raise IdentityTokenError("unknown key id") from exc
        verification_key = signing.key
        expected_alg = algorithm
    try:
        return jwt.decode(
            token,
            verification_key,
            algorithms=[expected_alg],
            audience=trusted.get("audience") or settings.OIDC_AUDIENCE,
            issuer=trusted["issuer"],
            options={"require": ["exp", "iat", "sub", "aud", "iss"]},
            leeway=5,
        )
    except jwt.ExpiredSignatureError as exc:
        raise IdentityTokenError("subject_token has expired") from exc
    except jwt.InvalidAudienceError as exc:
        raise IdentityTokenError("subject_token has the wrong audience") from exc
    except jwt.PyJWTError as exc:
        raise IdentityTokenError(f"subject_token is invalid: {exc}") from exc


@dataclass(frozen=True)
class ExchangeSubject:
    """Who a verified identity token stands for: a sandbox acting for its creator."""

    user_id: str
    organization_id: str
    sandbox_id: str


SubjectResolver = Callable[[dict[str, Any]], ExchangeSubject | None]
_resolvers: list[SubjectResolver] = []


def register_subject_resolver(resolver: SubjectResolver) -> None:
    """The sandboxes app registers how claims map to a live sandbox (None when it is gone)."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def resolve_subject(claims: dict[str, Any]) -> ExchangeSubject | None:
    for resolver in _resolvers:
        subject = resolver(claims)
        if subject is not None:
            return subject
    return None
