"""Run every process the service needs (the ASGI server, Celery worker, Celery beat) and print how to get in.

Used by `make run`. Children share this process group's lifetime: Ctrl-C or SIGTERM stops them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from accounts import services
from accounts.models import ApiToken, Role
from common import http_server

DEMO_ORG = "demo"
DEMO_EMAIL = "admin@example.com"
TOKEN_NAME = "make run"  # noqa: S105 - a label, not a secret


class Command(BaseCommand):
    help = "Start the web server, Celery worker and beat; print the dashboard URL and a usable token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.PORT)

    def _bootstrap_token(self) -> str:
        membership = services.ensure_member(org_slug=DEMO_ORG, email=DEMO_EMAIL, role=Role.OWNER, org_name="Demo")
        user = membership.user
        if not user.is_staff:
            user.is_staff = user.is_superuser = True
            user.save(update_fields=["is_staff", "is_superuser"])
        # One live start-up token at a time: earlier runs' tokens are revoked rather than piling up.
        for old in ApiToken.objects.filter(user=user, name=TOKEN_NAME, revoked_at__isnull=True):
            services.revoke_token(token=old)
        return services.create_token(user=user, organization=membership.organization, name=TOKEN_NAME).raw

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        python = sys.executable
        env = {**os.environ, "PORT": str(port)}
        commands = [
            # uvicorn, not daphne: it applies flow control to request and response bodies, so a 1 GiB
            # upload or download streams through in bounded memory (daphne queues whole bodies).
            [
                python,
                "-m",
                "uvicorn",
                "--host",
                host,
                "--port",
                str(port),
                "--lifespan",
                "off",
                # uvicorn's httptools protocol, plus handing request bodies over to be spliced into
                # files (common.http_server).
                "--http",
                http_server.PROTOCOL,
                "config.asgi:application",
            ],
            [python, "-m", "celery", "-A", "config", "worker", "--loglevel=INFO", "--concurrency=2"],
            [python, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO"],
        ]
        token = self._bootstrap_token()
        # Sandboxes survive a restart of the service; reconcile before serving so the database and the
        # runtime agree on what runs.
        call_command("reconcile_sandboxes")
        children = [subprocess.Popen(cmd, env=env) for cmd in commands]

        def stop(*_: Any) -> None:
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

        url = f"http://{host}:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):  # noqa: S310 - our own http URL
                    break
            except urllib.error.HTTPError as unhealthy:
                # Serving, with something down (no bubblewrap, say): /healthz says what; say it too.
                detail = unhealthy.read().decode(errors="replace")
                self.stderr.write(f"The service is up, but not everything is healthy: {detail}")
                break
            except Exception:
                if any(child.poll() is not None for child in children):
                    self.stderr.write("A process exited during start-up; see the output above.")
                    stop()
                time.sleep(0.5)

        self.stdout.write(
            "\n"
            f"  API docs:   {url}/api/docs\n"
            f"  Health:     {url}/healthz\n"
            f"  Token:      {token}\n"
            f"              (owner of organization '{DEMO_ORG}', user {DEMO_EMAIL}; paste it on the sign-in page)\n"
            f"  Dashboard:  {url}/\n"
        )
        sys.stdout.flush()
        while True:
            for child in children:
                if child.poll() is not None:
                    self.stderr.write(f"{child.args!r} exited with {child.returncode}; stopping.")
                    stop()
            time.sleep(1)
