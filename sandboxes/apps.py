from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"

    def ready(self) -> None:
        from sandboxes import health  # noqa: F401 - registers the runtime readiness check
