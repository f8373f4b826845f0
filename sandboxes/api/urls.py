from typing import Any

from django.urls import path

from common.asyncviews import AsyncView
from sandboxes.api import streaming, views


def _async(view: AsyncView) -> Any:
    # Django serves coroutine views as they are; the stubs only type plain and Coroutine-returning ones.
    return view


urlpatterns = [
    path("sandboxes", views.SandboxListView.as_view(), name="sandboxes"),
    path("sandboxes/<str:sandbox_id>", views.SandboxDetailView.as_view(), name="sandbox-detail"),
    path("sandboxes/<str:sandbox_id>/exec", _async(streaming.exec_view), name="sandbox-exec"),
    path("sandboxes/<str:sandbox_id>/read-file", _async(streaming.read_file_view), name="sandbox-read-file"),
    path("sandboxes/<str:sandbox_id>/write-file", _async(streaming.write_file_view), name="sandbox-write-file"),
]
