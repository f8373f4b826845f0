from django.urls import path

from audit.api import views

urlpatterns = [
    path("sandboxes/<str:sandbox_id>/audit-logs", views.SandboxAuditLogView.as_view(), name="sandbox-audit-logs"),
]
