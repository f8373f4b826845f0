from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"

    def ready(self) -> None:
        from sandboxes import credentials, health  # noqa: F401 - register the exchange resolver and health check
