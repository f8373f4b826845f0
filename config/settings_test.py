"""Test settings: the real services the environment points at (PostgreSQL and Redis in CI).

Nothing is faked here: Celery is not eager, and the broker is whatever REDIS_URL says (or the
embedded filesystem broker when it is unset).
"""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("SVC_ENV", "test")
# Each test session gets its own state directory so parallel runs and a developer's `make run` never
# share sandboxes, broker folders or generated keys.
os.environ.setdefault("SVC_VAR_DIR", tempfile.mkdtemp(prefix="svc-test-"))

from config.settings import *  # noqa: F403
from config.settings import VAR_DIR

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
TEST_VAR_DIR: Path = VAR_DIR
