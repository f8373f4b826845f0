"""Create (if missing) an organization and user, and print a new access token on stdout, alone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts import services
from accounts.models import Role


class Command(BaseCommand):
    help = "Create an access token (creating the organization and user when missing) and print it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="Organization slug")
        parser.add_argument("--email", required=True)
        parser.add_argument(
            "--role", choices=Role.values, default=None, help="Role (default: member for a new membership)"
        )
        parser.add_argument("--name", default="cli", help="Token name shown in lists")
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            membership = services.ensure_member(org_slug=options["org"], email=options["email"], role=options["role"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        days = options["expires_days"]
        issued = services.create_token(
            user=membership.user,
            organization=membership.organization,
            name=options["name"],
            expires_at=timezone.now() + timedelta(days=days) if days else None,
        )
        # Only the token on stdout, so scripts can do TOKEN=$(manage.py createtoken ...).
        self.stdout.write(issued.raw)
