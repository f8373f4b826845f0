"""Settings read in a fresh interpreter, as a deployment would start: production demands its secrets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parents[2]


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("SECRET_KEY", "ENCRYPTION_KEY", "SVC_", "DJANGO_"))
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)",
        ],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", "SVC_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_starts_with_secrets_from_the_environment(tmp_path: Path) -> None:
    keys = f"{Fernet.generate_key().decode()},{Fernet.generate_key().decode()}"
    signing_key = tmp_path / "signing.pem"
    signing_key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    secrets = {"SECRET_KEY": "s" * 50, "ENCRYPTION_KEYS": keys, "OIDC_SIGNING_KEY_FILES": str(signing_key)}
    loaded = _load_settings(tmp_path, SVC_ENV="production", ALLOWED_HOSTS="svc.example", **secrets)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "False"
    assert not (tmp_path / "encryption_key").exists() and not (tmp_path / "secret_key").exists()


def test_production_refuses_missing_or_bad_secrets(tmp_path: Path) -> None:
    no_keys = _load_settings(tmp_path, SVC_ENV="production", SECRET_KEY="s" * 50)
    assert no_keys.returncode != 0 and "ENCRYPTION_KEY must be set" in no_keys.stderr
    no_secret = _load_settings(tmp_path, SVC_ENV="production", ENCRYPTION_KEYS=Fernet.generate_key().decode())
    assert no_secret.returncode != 0 and "SECRET_KEY must be set" in no_secret.stderr
    bad_key = _load_settings(tmp_path, SVC_ENV="production", SECRET_KEY="s" * 50, ENCRYPTION_KEYS="not-a-key")
    assert bad_key.returncode != 0 and "must be Fernet keys" in bad_key.stderr
    no_signing_key = _load_settings(
        tmp_path, SVC_ENV="production", SECRET_KEY="s" * 50, ENCRYPTION_KEYS=Fernet.generate_key().decode()
    )
    assert no_signing_key.returncode != 0 and "OIDC_SIGNING_KEY_FILES must be set" in no_signing_key.stderr


def test_development_generates_local_secrets_once(tmp_path: Path) -> None:
    first = _load_settings(tmp_path, SVC_ENV="development")
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "encryption_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    before = key_file.read_text()
    assert _load_settings(tmp_path, SVC_ENV="development").returncode == 0
    assert key_file.read_text() == before


def test_malformed_rate_limits_are_refused(tmp_path: Path) -> None:
    loaded = _load_settings(tmp_path, SVC_ENV="development", API_RATE_LIMIT="lots")
    assert loaded.returncode != 0 and "API_RATE_LIMIT must look like 100/min" in loaded.stderr
