"""Benchmarks: each module exposes ``run() -> dict[str, float]`` and prints its own figures.

Figures are ratios against the bare-process limit measured in the same run, so they mean the same on
any machine. Timings are reported, never asserted.
"""

from pathlib import Path


def signing_key_file(directory: Path) -> str:
    """A fresh identity-token signing key in ``directory``: production settings require one from
    configuration (OIDC_SIGNING_KEY_FILES), as a deployment gives it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_file = directory / "oidc-signing-key.pem"
    key_file.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    return str(key_file)
