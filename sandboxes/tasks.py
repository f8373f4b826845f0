"""Periodic sandbox jobs (scheduled in config/celery.py). Each takes no arguments and calls a service."""

from __future__ import annotations

from celery import shared_task

from sandboxes import credentials, services


@shared_task(name="sandboxes.reap_idle")
def reap_idle() -> list[str]:
    return services.reap_idle()


@shared_task(name="sandboxes.refresh_credentials")
def refresh_credentials() -> dict[str, bool]:
    return {sandbox.pk: credentials.refresh(sandbox) for sandbox in credentials.due_for_refresh()}


@shared_task(name="sandboxes.reconcile")
def reconcile() -> dict[str, list[str]]:
    return services.reconcile()
