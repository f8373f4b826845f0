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
if "SVC_VAR_DIR" not in os.environ:
    _var = tempfile.mkdtemp(prefix="svc-test-")
    # Sandboxes run as unprivileged host users and live below this directory: it must be traversable.
    os.chmod(_var, 0o755)  # noqa: S103 - holds nothing secret that its files do not protect themselves
    os.environ["SVC_VAR_DIR"] = _var
# Tests and benchmarks drive many requests with one token in seconds; the rate-limit tests turn the
# limits on themselves. Set in the environment so live servers started by tests inherit it.
os.environ.setdefault("API_RATE_LIMIT", "")
os.environ.setdefault("TOKEN_EXCHANGE_RATE_LIMIT", "")
# Per-run cache keys: a shared Redis (CI) never mixes the counts of two runs.
os.environ.setdefault("SVC_CACHE_PREFIX", f"svc-test-{os.getpid()}")

from config.settings import *  # noqa: F403
from config.settings import VAR_DIR

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
TEST_VAR_DIR: Path = VAR_DIR

# SQLite tests use a file (not memory) so a live server started by a test in another process sees the
# same database.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # Closed after every request, as on PostgreSQL: the test database file is replaced between runs.
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}  # noqa: F405
else:
    # One test database per run, so concurrent runs on one server (developers, CI) never drop each
    # other's tables.
    DATABASES["default"]["TEST"] = {"NAME": f"test_svc_{os.getpid()}"}  # noqa: F405
# A live server process started by the tests points at the test database the test run created.
if os.environ.get("SVC_TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["SVC_TEST_DATABASE_NAME"]  # noqa: F405

# One Celery queue per test run: concurrent runs sharing a Redis never take each other's tasks. The
# variable is inherited by the worker and beat processes the tests start.
CELERY_TASK_DEFAULT_QUEUE = os.environ.setdefault("SVC_TEST_QUEUE", f"svc-test-{os.getpid()}")
