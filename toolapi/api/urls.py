from django.urls import path

from toolapi.api import views

urlpatterns = [
    path("mcp-servers", views.McpServerListView.as_view(), name="mcp-servers"),
    path("mcp-servers/<str:server_id>", views.McpServerDetailView.as_view(), name="mcp-server-detail"),
    path("mcp-servers/<str:server_id>/refresh", views.McpServerRefreshView.as_view(), name="mcp-server-refresh"),
    path("tool-calls", views.ToolCallListView.as_view(), name="tool-calls"),
]
