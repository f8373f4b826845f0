"""Periodic and on-demand tool discovery."""

from __future__ import annotations

from celery import shared_task

from toolapi import services


@shared_task(name="toolapi.refresh_all_tool_catalogs")
def refresh_all_tool_catalogs() -> dict[str, bool]:
    return services.refresh_all_servers()


@shared_task(name="toolapi.refresh_server_tools")
def refresh_server_tools(server_id: str) -> bool:
    result = services.refresh_server_by_id(server_id)
    return bool(result and result.ok)
