"""Routes outside /api/v1: the tool HTTP API (its own OpenAPI document) and the dashboard pages."""

from django.urls import path

from toolapi import dashboard, views

urlpatterns = [
    path("api/mcp-httpapi/openapi.json", views.openapi_json, name="toolapi-openapi"),
    path("api/mcp-httpapi/tools/<str:tool_name>", views.call_tool, name="toolapi-call"),
    # The form used in the published usage example, without the `tools` segment.
    path("api/mcp-httpapi/<str:tool_name>", views.call_tool, name="toolapi-call-short"),
    path("tools/", dashboard.tools_page, name="dashboard-tools"),
    path("tools/servers/<str:server_id>/", dashboard.server_page, name="dashboard-tool-server"),
    path("tools/servers/<str:server_id>/refresh/", dashboard.refresh_server, name="dashboard-tool-server-refresh"),
]
