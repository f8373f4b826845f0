from django.apps import AppConfig


class ToolapiConfig(AppConfig):
    name = "toolapi"
    verbose_name = "Tool HTTP API"
