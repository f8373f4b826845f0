"""Where the OIDC signing keys come from: generated locally outside production, required in production."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.exceptions import ImproperlyConfigured

from accounts import oidc

ROOT = Path(__file__).resolve().parents[2]
MISSING = "OIDC_SIGNING_KEY_FILES must be set when SVC_ENV=production"


def _production_start(var_dir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """Start Django as a production process would (settings, apps) and print the published key ids."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OIDC_", "SVC_", "DJANGO_")) and key not in ("SECRET_KEY", "ENCRYPTION_KEYS")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SVC_ENV": "production",
            "SVC_VAR_DIR": str(var_dir),
            "SECRET_KEY": "not-a-real-secret-but-set",
            "ENCRYPTION_KEY": Fernet.generate_key().decode(),
            **extra,
        }
    )
    script = (
        "import django, json; django.setup(); from accounts import oidc; "
        "print(json.dumps([key['kid'] for key in oidc.jwks()['keys']]))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _key_file(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def test_a_production_process_does_not_start_without_configured_signing_keys(tmp_path: Path) -> None:
    refused = _production_start(tmp_path)
    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr and MISSING in refused.stderr, refused.stderr
    assert not (tmp_path / "oidc").exists(), "no key is generated in production"

    # A configured key file that is missing also stops the start, rather than the first sandbox.
    missing = _production_start(tmp_path, OIDC_SIGNING_KEY_FILES=str(tmp_path / "nowhere.pem"))
    assert missing.returncode != 0 and "nowhere.pem" in missing.stderr, missing.stderr

    first, second = _key_file(tmp_path / "a.pem"), _key_file(tmp_path / "b.pem")
    started = _production_start(tmp_path, OIDC_SIGNING_KEY_FILES=f"{first},{second}")
    assert started.returncode == 0, started.stderr
    kids = json.loads(started.stdout.strip().splitlines()[-1])
    assert len(kids) == 2 and len(set(kids)) == 2
    assert not (tmp_path / "oidc").exists()


def test_production_never_generates_a_key(settings: Any, tmp_path: Path) -> None:
    generated = tmp_path / "oidc" / "signing-key.pem"
    settings.OIDC_GENERATED_KEY_FILE = generated
    settings.OIDC_SIGNING_KEY_FILES = []
    settings.PRODUCTION = True
    with pytest.raises(ImproperlyConfigured, match=MISSING):
        oidc.signing_keys()
    assert not generated.exists()


def test_outside_production_one_private_key_is_generated_and_kept(settings: Any, tmp_path: Path) -> None:
    generated = tmp_path / "oidc" / "signing-key.pem"
    settings.OIDC_GENERATED_KEY_FILE = generated
    settings.OIDC_SIGNING_KEY_FILES = []
    kid = oidc.signing_keys()[0].kid
    assert generated.stat().st_mode & 0o777 == 0o600
    # Read again, as the next process to start does: the same key, not a new one.
    oidc.signing_keys.cache_clear()
    assert oidc.signing_keys()[0].kid == kid
