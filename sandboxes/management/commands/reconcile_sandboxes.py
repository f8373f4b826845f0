from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from sandboxes import services


class Command(BaseCommand):
    help = "Make the database and the sandbox runtime agree: free vanished sandboxes, destroy orphans."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(json.dumps(services.reconcile()))
