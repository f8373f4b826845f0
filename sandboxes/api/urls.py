from django.urls import path

from sandboxes.api import streaming, views

urlpatterns = [
    path("sandboxes", views.SandboxListView.as_view(), name="sandboxes"),
    path("sandboxes/<str:sandbox_id>", views.SandboxDetailView.as_view(), name="sandbox-detail"),
    path("sandboxes/<str:sandbox_id>/exec", streaming.exec_view, name="sandbox-exec"),
    path("sandboxes/<str:sandbox_id>/read-file", streaming.read_file_view, name="sandbox-read-file"),
    path("sandboxes/<str:sandbox_id>/write-file", streaming.write_file_view, name="sandbox-write-file"),
]
