"""common/crypto: secrets at rest with rotatable Fernet keys."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.test import override_settings

from common import crypto


def test_round_trip_and_no_plaintext() -> None:
    token = crypto.encrypt("hunter2")
    assert "hunter2" not in token
    assert crypto.decrypt_str(token) == "hunter2"
    assert crypto.decrypt_json(crypto.encrypt_json({"Authorization": "Bearer x"})) == {"Authorization": "Bearer x"}


def test_rotation_by_prepending_a_key() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(ENCRYPTION_KEYS=[old]):
        token = crypto.encrypt(b"secret")
    with override_settings(ENCRYPTION_KEYS=[new, old]):
        assert crypto.decrypt(token) == b"secret"
        rotated = crypto.rotate(token)
    with override_settings(ENCRYPTION_KEYS=[new]):
        assert crypto.decrypt(rotated) == b"secret"
        with pytest.raises(crypto.DecryptionError):
            crypto.decrypt(token)


def test_tampering_is_detected() -> None:
    token = crypto.encrypt("value")
    tampered = token[:-4] + ("A" if token[-4] != "A" else "B") + token[-3:]
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(tampered)
