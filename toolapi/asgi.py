"""The tool HTTP API served straight from ASGI, in front of Django's request cycle (common.fastpath).

A proxied tool call is a few milliseconds of real work; under Django's async handler most of its
latency went to the cycle around the view. Here the same async views (toolapi.views) run for the
same URLs with exactly the same request and response objects; common.fastpath accounts for each
middleware and hands everything else to Django.

Requests served here run outside Django's request cycle, so database work releases its connection
itself (toolapi.views.OUTSIDE_REQUEST_CYCLE), and a plain call's audit record goes to the batched
writer (toolapi.recording) once the response was sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from django.core.handlers.asgi import ASGIHandler
from django.http import HttpResponseBase

from common.fastpath import DirectAsgi, Routes, View
from toolapi import views
from toolapi.recording import recorder
from toolapi.upstream import hub

PREFIX = "/api/mcp-httpapi/"
TOOLS = "tools/"


def route(path_info: str) -> tuple[View, dict[str, str]] | None:
    """The view and arguments Django's URLconf (toolapi.root_urls) gives ``path_info``, for its routes."""
    if not path_info.startswith(PREFIX):
        return None
    rest = path_info[len(PREFIX) :]
    if rest == "openapi.json":
        return views.openapi_json, {}
    if rest.startswith(TOOLS) and rest != TOOLS and "/" not in rest[len(TOOLS) :]:
        return views.call_tool, {"tool_name": rest[len(TOOLS) :]}
    if rest and "/" not in rest:
        return views.call_tool, {"tool_name": rest}
    return None


class ToolHttpApiRoutes(Routes):
    name = "tool HTTP API"

    def route(self, path_info: str) -> tuple[View, dict[str, str]] | None:
        return route(path_info)

    def started(self) -> None:
        hub.adopt_running_loop()

    @contextmanager
    def serving(self) -> Iterator[None]:
        outside = views.OUTSIDE_REQUEST_CYCLE.set(True)
        try:
            yield
        finally:
            views.OUTSIDE_REQUEST_CYCLE.reset(outside)

    def finished(self, response: HttpResponseBase) -> None:
        if isinstance(response, views.AuditedResponse):
            record = response.take_record()
            if record is not None:
                recorder.submit(record)


class WithToolHttpApi(DirectAsgi):
    """Serves the tool HTTP API's routes (and ``also``'s) from ASGI and everything else through ``app``."""

    def __init__(self, app: ASGIHandler, also: Sequence[Routes] = ()) -> None:
        super().__init__(app, [ToolHttpApiRoutes(), *also])
