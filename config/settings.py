"""Settings for every environment, read from the environment through config.env.

With nothing set the service runs on embedded defaults (SQLite, an in-memory channel layer and a
filesystem Celery broker) so a newcomer needs no server. DATABASE_URL switches to PostgreSQL and
REDIS_URL to Redis for Celery and Channels.
"""

from __future__ import annotations

import re
from pathlib import Path

import dj_database_url
import django_stubs_ext
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_json,
    env_list,
    env_str,
    local_secret,
    token_urlsafe,
)

# Lets Django's generic classes (ModelAdmin[Model], QuerySet[Model]) be subscripted at run time.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("SVC_VAR_DIR", str(BASE_DIR / "var")) or BASE_DIR / "var")

SVC_ENV = env_choice("SVC_ENV", "development", {"development", "production", "test"})
PRODUCTION = SVC_ENV == "production"

SECRET_KEY = local_secret("SECRET_KEY", VAR_DIR / "secret_key", production=PRODUCTION, generate=token_urlsafe)
# Comma-separated Fernet keys, newest first: data is encrypted with the first and decrypted with any,
# so a key can be rotated by prepending a new one and re-encrypting at leisure.
ENCRYPTION_KEYS = env_list("ENCRYPTION_KEYS", []) or [
    # Only without ENCRYPTION_KEYS: then a single ENCRYPTION_KEY, or (outside production) a local file.
    local_secret(
        "ENCRYPTION_KEY",
        VAR_DIR / "encryption_key",
        production=PRODUCTION,
        generate=lambda: Fernet.generate_key().decode(),
    )
]
for _key in ENCRYPTION_KEYS:
    try:
        Fernet(_key)
    except ValueError:
        raise ImproperlyConfigured(
            "ENCRYPTION_KEYS/ENCRYPTION_KEY must be Fernet keys (32 url-safe base64-encoded bytes)."
        ) from None

DEBUG = env_bool("DEBUG", not PRODUCTION and SVC_ENV != "test")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["*"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
PORT = env_int("PORT", 8000, minimum=1)
# The address sandboxes, the CLI and printed examples use to reach this service.
BASE_URL = (env_str("BASE_URL") or f"http://127.0.0.1:{PORT}").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "common",
    "accounts",
    "dashboard",
]
# Apps added by later capabilities register themselves here, guarded so the tree stays importable
# while they are being built.
for _app in ("audit", "sandboxes", "terminal", "skills", "toolapi"):
    if (BASE_DIR / _app / "apps.py").exists():
        INSTALLED_APPS.append(_app)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the dashboard's and Swagger UI's static files from the ASGI server itself: no separate web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "common.middleware.ApiErrorMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.navigation",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "db.sqlite3"),
            # Kept open between requests: opening one (and Django's set-up of it) costs more than
            # the queries of a short request. A file on this machine has no server to overload.
            "CONN_MAX_AGE": env_int("DB_CONN_MAX_AGE", 600),
            # Streaming views and the Celery worker write concurrently; wait instead of failing.
            # WAL: readers never wait for the writer, and a commit appends to the log without a
            # disk sync (synchronous=NORMAL syncs at checkpoints): a crash of the service loses
            # nothing, a power cut at most the last commits. Deployments use PostgreSQL.
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Outside production, files are found in the apps directly, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = DEBUG

SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION

REDIS_URL = env_str("REDIS_URL")

# Celery: Redis when configured, otherwise kombu's filesystem transport, which lets the web process,
# worker and beat (separate processes started by `make run`) share a queue without any server.
CELERY_BROKER_DIR = VAR_DIR / "celery"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
else:
    CELERY_BROKER_URL = "filesystem://"
    for _sub in ("queue", "processed", "control"):
        (CELERY_BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR / "queue"),
        "data_folder_out": str(CELERY_BROKER_DIR / "queue"),
        "processed_folder": str(CELERY_BROKER_DIR / "processed"),
        # Broadcast (pidbox) messages; kombu's default is a "control" folder in the working directory.
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "store_processed": False,
    }
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 240, minimum=1)
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Rate limits (common/throttling.py) count in this cache: Redis when configured, so every process of
# the service shares the counts; otherwise this process's memory.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("SVC_CACHE_PREFIX") or "svc",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Requests per token to the REST API, and token exchanges per client address ("<n>/<s|min|hour|day>";
# empty turns the limit off). Beyond them: 429 with Retry-After.
_RATE = r"^(\d+/(s|sec|second|m|min|minute|h|hour|d|day))?$"
API_RATE_LIMIT = env_str("API_RATE_LIMIT", "1200/min") or ""
TOKEN_EXCHANGE_RATE_LIMIT = env_str("TOKEN_EXCHANGE_RATE_LIMIT", "600/min") or ""
for _name, _rate in (("API_RATE_LIMIT", API_RATE_LIMIT), ("TOKEN_EXCHANGE_RATE_LIMIT", TOKEN_EXCHANGE_RATE_LIMIT)):
    if not re.match(_RATE, _rate):
        raise ImproperlyConfigured(f"{_name} must look like 100/min (or be empty to turn it off), not {_rate!r}.")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["common.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["common.permissions.IsOrganizationMember"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "common.errors.api_exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["common.throttling.TokenRateThrottle"],
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "svc API",
    "DESCRIPTION": "Sandboxes for agents, the tool HTTP API and skills.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [
        "common.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI assets are served from the installed package: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Personal access tokens.
TOKEN_PREFIX = "svc_pat_"  # noqa: S105 - a public prefix, not a secret
# Longest data a non-streaming JSON request may carry; streaming uploads have their own limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 5 * 1024 * 1024, minimum=1024)

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", {"DEBUG", "INFO", "WARNING", "ERROR"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# OIDC: this service issues identity tokens to its own sandboxes (local runtime) and publishes the keys.
# Signing keys are PEM files, the first one signs; list several to rotate (all are published in the JWKS).
OIDC_SIGNING_KEY_FILES = env_list("OIDC_SIGNING_KEY_FILES", [])
if PRODUCTION and not OIDC_SIGNING_KEY_FILES:
    # A generated key would differ between replicas (and vanish with a container's disk).
    raise ImproperlyConfigured("OIDC_SIGNING_KEY_FILES must be set when SVC_ENV=production.")
# How long keys fetched from a trusted issuer's JWKS are kept before they are fetched again (a key
# the issuer withdraws stops being accepted within this bound).
OIDC_TRUSTED_JWKS_CACHE_SECONDS = env_int("OIDC_TRUSTED_JWKS_CACHE_SECONDS", 300, minimum=1)
OIDC_GENERATED_KEY_FILE = VAR_DIR / "oidc" / "signing-key.pem"
OIDC_ISSUER = (env_str("OIDC_ISSUER") or BASE_URL).rstrip("/")
OIDC_AUDIENCE = env_str("OIDC_AUDIENCE", "svc") or "svc"
# Other issuers whose identity tokens the exchange accepts (e.g. a Kubernetes cluster's service-account
# issuer), as JSON: [{"issuer": "...", "jwksUri": "...", "audience": "..."}].
OIDC_TRUSTED_ISSUERS: list[dict[str, str]] = env_json("OIDC_TRUSTED_ISSUERS", [])
if not isinstance(OIDC_TRUSTED_ISSUERS, list) or not all(
    isinstance(item, dict) and {"issuer", "jwksUri"} <= set(item) for item in OIDC_TRUSTED_ISSUERS
):
    raise ImproperlyConfigured('OIDC_TRUSTED_ISSUERS must be a JSON list of {"issuer", "jwksUri", "audience"?}.')
SANDBOX_IDENTITY_TOKEN_SECONDS = env_int("SANDBOX_IDENTITY_TOKEN_SECONDS", 300, minimum=10)
SANDBOX_API_TOKEN_SECONDS = env_int("SANDBOX_API_TOKEN_SECONDS", 3600, minimum=5)

# Sandboxes.
SANDBOX_RUNTIME = env_choice("SANDBOX_RUNTIME", "local", {"local"})
SANDBOX_ROOT = Path(env_str("SANDBOX_ROOT") or VAR_DIR / "sandboxes")
# auto: user-mode networking with the host's loopback blocked, or no network at all when that cannot
# be had (fail closed); none: never any network; host: the host's network, loopback included (opt-in).
SANDBOX_NETWORK = env_choice("SANDBOX_NETWORK", "auto", {"auto", "pasta", "slirp4netns", "none", "host"})
SANDBOX_MAX_PER_ORG = env_int("SANDBOX_MAX_PER_ORG", 10, minimum=1)
SANDBOX_IDLE_SECONDS = env_int("SANDBOX_IDLE_SECONDS", 30 * 60, minimum=1)
SANDBOX_CPUS = env_float("SANDBOX_CPUS", 1.0, minimum=0.01)
SANDBOX_MEMORY_BYTES = env_int("SANDBOX_MEMORY_BYTES", 1024**3, minimum=64 * 1024**2)
SANDBOX_PIDS_MAX = env_int("SANDBOX_PIDS_MAX", 1024, minimum=16)
SANDBOX_EXEC_DEFAULT_TIMEOUT = env_float("SANDBOX_EXEC_DEFAULT_TIMEOUT", 300, minimum=1)
SANDBOX_EXEC_MAX_TIMEOUT = env_float("SANDBOX_EXEC_MAX_TIMEOUT", 3600, minimum=1)
SANDBOX_EXEC_MAX_COMMAND_BYTES = env_int("SANDBOX_EXEC_MAX_COMMAND_BYTES", 4 * 1024 * 1024, minimum=1024)
SANDBOX_WRITE_MAX_BYTES = env_int("SANDBOX_WRITE_MAX_BYTES", 1024**3, minimum=1)
# A write-file or read-file body moved by the kernel (common/zerocopy.py) whose client sends or
# reads nothing for this long is dropped (its connection closed).
FILE_TRANSFER_STALL_SECONDS = env_float("FILE_TRANSFER_STALL_SECONDS", 120, minimum=1)
# While an exec or a session runs, the sandbox's activity time is refreshed this often, so the
# inactivity reaper never takes a sandbox that is busy.
SANDBOX_ACTIVITY_HEARTBEAT_SECONDS = env_int("SANDBOX_ACTIVITY_HEARTBEAT_SECONDS", 60, minimum=1)
SANDBOX_RECONCILE_SECONDS = env_int("SANDBOX_RECONCILE_SECONDS", 300, minimum=1)
# Sandboxes the web process keeps started ahead of demand, so a create only claims one. Off in the
# test settings: tests create and count many sandboxes and must see only their own.
SANDBOX_WARM_POOL_SIZE = env_int("SANDBOX_WARM_POOL_SIZE", 0 if SVC_ENV == "test" else 2, minimum=0)
SANDBOX_REAPER_SECONDS = env_float("SANDBOX_REAPER_SECONDS", 60, minimum=0.5)
SANDBOX_CREDENTIALS_REFRESH_SECONDS = env_float("SANDBOX_CREDENTIALS_REFRESH_SECONDS", 60, minimum=0.5)
# A sandbox's token is renewed once it has less than this left.
SANDBOX_CREDENTIALS_MARGIN_SECONDS = env_int("SANDBOX_CREDENTIALS_MARGIN_SECONDS", 600, minimum=1)
# The service as a sandbox reaches it (the runtime forwards the service's port to the sandbox's loopback).
SANDBOX_SERVICE_URL = (env_str("SANDBOX_SERVICE_URL") or f"http://127.0.0.1:{PORT}").rstrip("/")

# How much of each exec's stdout and stderr the audit log keeps (byte counts are always complete).
AUDIT_OUTPUT_CAP_BYTES = env_int("AUDIT_OUTPUT_CAP_BYTES", 64 * 1024, minimum=0)

# Per-process caches of a token's resolved caller (bearer streaming endpoints, tool API, /api/mcp) and of
# tool lookups. Revocations made by this process apply at once; others within this bound. 0 disables.
PRINCIPAL_CACHE_SECONDS = env_float("PRINCIPAL_CACHE_SECONDS", 2.0, minimum=0)
TOOL_CACHE_SECONDS = env_float("TOOL_CACHE_SECONDS", 2.0, minimum=0)
# Per-process memory of a running sandbox's daemon address and secret for exec/read-file/write-file.
# A destroy elsewhere is noticed when the daemon is gone (the database is then read again). 0 disables.
SANDBOX_LOOKUP_CACHE_SECONDS = env_float("SANDBOX_LOOKUP_CACHE_SECONDS", 2.0, minimum=0)

HEALTH_TIMEOUT_SECONDS = env_float("HEALTH_TIMEOUT_SECONDS", 2.0, minimum=0.1)

# Tool HTTP API (toolapi/): SSE keepalive interval, discovery schedule and upstream connection limits.
TOOLAPI_KEEPALIVE_SECONDS = env_float("TOOLAPI_KEEPALIVE_SECONDS", 15.0, minimum=0.05)
TOOLAPI_REFRESH_SECONDS = env_float("TOOLAPI_REFRESH_SECONDS", 300.0, minimum=1)
TOOLAPI_CONNECT_TIMEOUT_SECONDS = env_float("TOOLAPI_CONNECT_TIMEOUT_SECONDS", 10.0, minimum=0.1)
TOOLAPI_DEFAULT_TIMEOUT_SECONDS = env_float("TOOLAPI_DEFAULT_TIMEOUT_SECONDS", 300.0, minimum=0.1)
TOOLAPI_UPSTREAM_IDLE_SECONDS = env_float("TOOLAPI_UPSTREAM_IDLE_SECONDS", 300.0, minimum=1)
