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
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from common.ids import new_id

# Only asymmetric algorithms: a symmetric one would let anyone holding the public key forge tokens.
ALLOWED_ALGORITHMS = ["ES256", "RS256"]

# How long a trusted issuer's fetched JWKS is used before it is fetched again: a key the issuer
# removes (rotated out, or compromised) stops being accepted within this bound.
DEFAULT_TRUSTED_JWKS_CACHE_SECONDS = 300


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
    try:
        # Created with 0600 from the start so the private key is never briefly readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process (web, worker, beat start together) generated it first: use theirs
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


def _key_files() -> list[Path]:
    configured = [Path(p) for p in settings.OIDC_SIGNING_KEY_FILES]
    if configured:
        return configured
    if settings.PRODUCTION:
        # A key generated under var/ would differ between replicas (a token signed by one is refused
        # by the next) and silently change whenever var/ is lost, so production never generates one.
        raise ImproperlyConfigured(
            "OIDC_SIGNING_KEY_FILES must be set when SVC_ENV=production: comma-separated paths of PEM "
            "private keys (EC P-256 or RSA), the same files on every replica; see docs/sandboxes.md."
        )
    generated = Path(settings.OIDC_GENERATED_KEY_FILE)
    if not generated.exists():
        _generate_key_file(generated)
    return [generated]


@cache
def signing_keys() -> tuple[SigningKey, ...]:
    """The configured keys, first one signing. Read once per process: a rotation takes a restart."""
    return tuple(_load_key(path) for path in _key_files())


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
def _remote_jwks_client(jwks_uri: str, lifespan: float) -> jwt.PyJWKClient:
    # Only the whole key set is cached, for ``lifespan``: PyJWKClient's per-kid cache never expires,
    # so a key the issuer removed would stay trusted in this process until it restarts. An unknown
    # kid refetches the set at most once per cooldown, so forged kids cannot make us hammer the issuer.
    return jwt.PyJWKClient(jwks_uri, cache_keys=False, cache_jwk_set=True, lifespan=lifespan, timeout=5)


def _trusted_jwks_cache_seconds() -> float:
    # Read with a default so the bound applies even where the setting is not declared.
    return float(getattr(settings, "OIDC_TRUSTED_JWKS_CACHE_SECONDS", DEFAULT_TRUSTED_JWKS_CACHE_SECONDS))


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
        client = _remote_jwks_client(trusted["jwksUri"], _trusted_jwks_cache_seconds())
        try:
            signing = client.get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError as exc:
            raise IdentityTokenError("the issuer's keys could not be fetched") from exc
        except jwt.PyJWTError as exc:
            raise IdentityTokenError("unknown key id") from exc
        # The key decides the algorithm, not the token's header: a header naming another algorithm
        # than the published key's is refused rather than tried.
        expected_alg = signing.algorithm_name
        if expected_alg != algorithm:
            raise IdentityTokenError(f"alg {algorithm!r} does not match the issuer's key")
        verification_key = signing.key
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


def _forget_keys(*, setting: str, **kwargs: Any) -> None:
    # Keys and remote key sets are cached per process; a changed setting (an override in tests) must
    # not keep serving the old ones.
    if setting in {"OIDC_SIGNING_KEY_FILES", "OIDC_GENERATED_KEY_FILE", "PRODUCTION"}:
        signing_keys.cache_clear()
    if setting in {"OIDC_TRUSTED_ISSUERS", "OIDC_TRUSTED_JWKS_CACHE_SECONDS"}:
        _remote_jwks_client.cache_clear()


setting_changed.connect(_forget_keys, dispatch_uid="accounts.oidc.forget_keys")

if settings.configured and settings.PRODUCTION:
    # Every process imports this module while Django starts (the sandboxes app registers its subject
    # resolver), so a missing or unreadable production key stops the start, as a missing SECRET_KEY
    # does, instead of failing the first sandbox create. (Imported before settings exist, by a script,
    # the same check runs at first use.)
    signing_keys()
