"""Encryption of secrets at rest (upstream MCP headers, sandbox SSH keys) with settings.ENCRYPTION_KEYS.

MultiFernet encrypts with the first key and decrypts with any of them, so a key is rotated by
prepending a new one; ``rotate`` re-encrypts a token under the newest key without exposing it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class DecryptionError(Exception):
    """The token was not produced by any configured key (or was tampered with)."""


@lru_cache(maxsize=4)
def _multi_fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("ENCRYPTION_KEYS is empty: secrets at rest cannot be encrypted.")
    try:
        return MultiFernet([Fernet(key.encode() if isinstance(key, str) else key) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(f"ENCRYPTION_KEYS holds a malformed Fernet key: {exc}") from exc


def _fernet() -> MultiFernet:
    # Keyed by the tuple so tests (or a reload) that change the setting get a matching instance.
    return _multi_fernet(tuple(settings.ENCRYPTION_KEYS))


def encrypt(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return _fernet().encrypt(raw).decode("ascii")


def decrypt(token: str) -> bytes:
    try:
        return _fernet().decrypt(token.encode("ascii"))
    except (InvalidToken, UnicodeEncodeError) as exc:
        raise DecryptionError("The value cannot be decrypted with the configured keys.") from exc


def decrypt_str(token: str) -> str:
    return decrypt(token).decode()


def encrypt_json(value: Any) -> str:
    return encrypt(json.dumps(value, separators=(",", ":"), sort_keys=True))


def decrypt_json(token: str) -> Any:
    return json.loads(decrypt(token))


def rotate(token: str) -> str:
    """Re-encrypt under the newest key (for a background re-encryption after rotation)."""
    try:
        return _fernet().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken as exc:
        raise DecryptionError("The value cannot be decrypted with the configured keys.") from exc
