"""exec, read-file and write-file served straight from ASGI (common.fastpath).

An exec of `true` is a millisecond of real work in the sandbox; under Django's request cycle most
of its round trip went to the sync middleware around the view. The views are the same
(sandboxes.api.streaming) for the same URLs; they need nothing from the request cycle: their
database work runs in worker threads, as it does under Django.
"""

from __future__ import annotations

from common.fastpath import Routes, View
from sandboxes.api import streaming

PREFIX = "/api/v1/sandboxes/"
_VIEWS: dict[str, View] = {
    "exec": streaming.exec_view,
    "read-file": streaming.read_file_view,
    "write-file": streaming.write_file_view,
}


def route(path_info: str) -> tuple[View, dict[str, str]] | None:
    """The view and arguments Django's URLconf (sandboxes.api.urls) gives ``path_info``, for the streams."""
    if not path_info.startswith(PREFIX):
        return None
    sandbox_id, slash, action = path_info[len(PREFIX) :].partition("/")
    view = _VIEWS.get(action)
    if not sandbox_id or not slash or view is None:
        return None
    return view, {"sandbox_id": sandbox_id}


class SandboxStreamRoutes(Routes):
    name = "sandbox streams"

    def route(self, path_info: str) -> tuple[View, dict[str, str]] | None:
        return route(path_info)
