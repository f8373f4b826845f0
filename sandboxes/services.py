"""Sandbox lifecycle: create within the organization's limit, destroy, record activity, reconcile.

The database decides who holds a slot (a row in an active status), the runtime holds the processes.
Slots are reserved under a lock on the organization row, so concurrent creates can never exceed the
limit, and freed the moment a destroy commits, before the runtime has finished cleaning up.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.services import revoke_sandbox_tokens
from audit.models import EventType
from audit.services import record_event
from common.crypto import decrypt_str, encrypt
from common.errors import ApiError
from common.principal import Principal
from common.ttlcache import TtlCache
from sandboxes import credentials
from sandboxes.daemon_client import DaemonClient, forget_kept
from sandboxes.models import ACTIVE_STATUSES, DestroyReason, Sandbox, SandboxStatus
from sandboxes.pool import get_pool
from sandboxes.runtime import get_runtime, parse_address
from sandboxes.runtimes.base import SandboxHandle, SandboxInfo, SandboxRuntime, SandboxState
from sandboxes.selectors import get_running_sandbox

logger = logging.getLogger(__name__)

# A sandbox still "creating" after this long was abandoned by a crashed process.
STALE_CREATE = timedelta(minutes=2)


def _reserve_slot(*, principal: Principal, address: str) -> tuple[Sandbox, credentials.FirstExchange | None]:
    """A slot, and a warm-pool sandbox for it when one is ready (the row then takes its id; the
    exchange handed to it is returned, None for a cold start).

    With a pool member the row is written as it ends up (running, where its daemon is) together
    with the create's audit event and the token its credentials exchange answers with: a create from
    the pool commits once. The member is handed that exchange before the commit (returned).
    """
    handle: SandboxHandle | None = None
    exchange: credentials.FirstExchange | None = None
    try:
        with transaction.atomic():
            # The row lock serializes creates per organization (PostgreSQL); SQLite's IMMEDIATE
            # transactions serialize all writers, which gives the same guarantee.
            org = Organization.objects.select_for_update().get(pk=principal.organization.pk)
            if not org.sandboxes_enabled:
                raise ApiError(
                    status_code=403,
                    code="sandboxes_not_enabled",
                    message="Sandboxes are not enabled for this organization; an owner or admin can enable them.",
                )
            active = Sandbox.objects.filter(organization=org, status__in=ACTIVE_STATUSES).count()
            limit = settings.SANDBOX_MAX_PER_ORG
            if active >= limit:
                raise ApiError(
                    status_code=409,
                    code="sandbox_limit_reached",
                    message=f"The organization already has {active} sandboxes; the limit is {limit}. Destroy one first.",
                    details={"limit": limit, "active": active},
                )
            # Claimed only once the slot is certain, so a refused create never takes a pool member.
            # Until this transaction commits the runtime reports the member as just claimed, which
            # reconciliation leaves alone.
            handle = get_pool().claim()
            fields: dict[str, Any] = {}
            if handle is not None:
                fields = {
                    "id": handle.sandbox_id,
                    "status": SandboxStatus.RUNNING,
                    "daemon_address": str(handle.address),
                    "daemon_secret_encrypted": encrypt(handle.secret),
                    "limits": _limits_record(handle),
                }
            sandbox = Sandbox(
                **fields,
                organization=org,
                created_by=principal.user,
                runtime=get_runtime().name,
                last_activity_at=timezone.now(),
            )
            if handle is not None:
                # The exchange's round trip is what the sandbox's first command waits for: it starts
                # now and overlaps the rest of this transaction, which its answer waits for.
                exchange = credentials.send_exchange(sandbox, DaemonClient(handle.address, handle.secret))
            sandbox.save(force_insert=True)
            if exchange is not None:
                _record_create(sandbox, principal, address)
                # After the create's event, which the token's (issued at its creation) follows.
                exchange.issue(sandbox)
    except BaseException:
        if exchange is not None:
            exchange.abandon()
        if handle is not None:
            get_runtime().destroy(handle.sandbox_id)
        raise
    if exchange is not None:
        exchange.settle()
    return sandbox, exchange


def _limits_record(handle: SandboxHandle) -> dict[str, Any]:
    return {
        "cpus": settings.SANDBOX_CPUS,
        "memoryBytes": settings.SANDBOX_MEMORY_BYTES,
        "pidsMax": settings.SANDBOX_PIDS_MAX,
        "enforcement": [limit.as_dict() for limit in handle.limits],
        "network": handle.network.as_dict() if handle.network else None,
    }


def _record_create(sandbox: Sandbox, principal: Principal, address: str) -> None:
    record_event(
        organization=principal.organization,
        event_type=EventType.SANDBOX_CREATE,
        sandbox_id=sandbox.pk,
        principal=principal,
        address=address,
        data={"runtime": sandbox.runtime, "limits": sandbox.limits},
    )


def _start_cold(sandbox: Sandbox, principal: Principal, address: str) -> None:
    """Start the sandbox of a reserved slot (no pool member was ready) and mark it running."""
    try:
        handle = get_runtime().create(sandbox.pk, secret=secrets.token_urlsafe(32), env={})
    except Exception as exc:
        logger.exception("sandbox %s failed to start", sandbox.pk)
        Sandbox.objects.filter(pk=sandbox.pk).update(status=SandboxStatus.FAILED, failure=str(exc)[:2000])
        raise ApiError(
            status_code=503, code="sandbox_start_failed", message=f"The sandbox could not be started: {exc}"
        ) from exc
    sandbox.daemon_address = str(handle.address)
    sandbox.daemon_secret_encrypted = encrypt(handle.secret)
    sandbox.limits = _limits_record(handle)
    sandbox.last_activity_at = timezone.now()
    # The exchange starts before the row says running: its round trip is what the first command
    # waits for, and its answer waits for this transaction.
    exchange = credentials.send_exchange(sandbox, DaemonClient(handle.address, handle.secret))
    try:
        with transaction.atomic():
            started = Sandbox.objects.filter(pk=sandbox.pk, status=SandboxStatus.CREATING).update(
                status=SandboxStatus.RUNNING,
                daemon_address=sandbox.daemon_address,
                daemon_secret_encrypted=sandbox.daemon_secret_encrypted,
                limits=sandbox.limits,
                last_activity_at=sandbox.last_activity_at,
            )
            if started:
                sandbox.status = SandboxStatus.RUNNING
                _record_create(sandbox, principal, address)
                exchange.issue(sandbox)
    except BaseException:
        exchange.abandon()
        raise
    if not started:
        exchange.abandon()
        # Destroyed while it was starting: nothing may keep running for it.
        get_runtime().destroy(sandbox.pk)
        raise ApiError(status_code=409, code="sandbox_destroyed", message="The sandbox was destroyed while starting.")
    exchange.settle()
    credentials.start_provisioning(sandbox, exchange)


def create_sandbox(*, principal: Principal, address: str = "") -> Sandbox:
    sandbox, exchange = _reserve_slot(principal=principal, address=address)
    if exchange is None:
        _start_cold(sandbox, principal, address)
    else:
        credentials.start_provisioning(sandbox, exchange)
    # Its activity was just recorded: the first operations after the create need not write it again.
    with _touched_lock:
        _remember_touch(sandbox.pk, time.monotonic())
    # Whoever creates a sandbox usually runs something in it next, and this process knows its daemon.
    remember_running(sandbox)
    return sandbox


def destroy_sandbox(
    *, sandbox: Sandbox, reason: str, principal: Principal | None = None, address: str = "", detail: str = ""
) -> bool:
    """Destroy once, whoever asks first (a person, the reaper, reconciliation). False if already gone."""
    credentials.record_waiting(sandbox.pk)
    with transaction.atomic():
        locked = Sandbox.objects.select_for_update().filter(pk=sandbox.pk).first()
        if locked is None or locked.status in (SandboxStatus.DESTROYED, SandboxStatus.FAILED):
            return False
        locked.status = SandboxStatus.DESTROYED
        locked.destroyed_at = timezone.now()
        locked.destroy_reason = reason
        locked.save(update_fields=["status", "destroyed_at", "destroy_reason"])
    forget_running(sandbox.pk)
    if locked.daemon_address.startswith("unix:"):
        # Its daemon stops now: the connections this process kept to it go with it, not when they expire.
        forget_kept(parse_address(locked.daemon_address).unix_path)
    revoke_sandbox_tokens(sandbox_id=sandbox.pk)
    try:
        get_runtime().destroy(sandbox.pk)
    except Exception:
        # The slot is already free; reconciliation retries the cleanup of whatever is left.
        logger.exception("runtime cleanup of sandbox %s failed", sandbox.pk)
    data: dict[str, Any] = {"reason": reason}
    if detail:
        data["detail"] = detail
    record_event(
        organization=locked.organization,
        event_type=EventType.SANDBOX_DESTROY,
        sandbox_id=sandbox.pk,
        principal=principal,
        address=address,
        data=data,
    )
    sandbox.refresh_from_db()
    return True


# When this process last recorded each sandbox's activity (time.monotonic()).
_touched: dict[str, float] = {}
_touched_lock = threading.Lock()


def touch_due(sandbox_id: str, unless_within: float) -> bool:
    """Whether an operation now should record activity; if so, it is counted as recorded.

    False when this process recorded the sandbox's activity less than ``unless_within`` seconds
    ago: the reaper counts idleness in minutes, so a burst of operations needs one write (a commit,
    on SQLite a disk sync), not one each.
    """
    if unless_within <= 0:
        return True
    now = time.monotonic()
    with _touched_lock:
        last = _touched.get(sandbox_id)
        if last is not None and now - last < unless_within:
            return False
        _remember_touch(sandbox_id, now)
    return True


def _remember_touch(sandbox_id: str, now: float) -> None:
    # Under _touched_lock.
    if len(_touched) > 10_000:
        _touched.clear()
    _touched[sandbox_id] = now


def touch(*, sandbox_id: str, unless_within: float = 0.0) -> None:
    """Record activity: one UPDATE, no read, so it is cheap on every operation (see touch_due)."""
    if touch_due(sandbox_id, unless_within):
        record_activity(sandbox_id)


def record_activity(sandbox_id: str) -> None:
    Sandbox.objects.filter(pk=sandbox_id, status=SandboxStatus.RUNNING).update(last_activity_at=timezone.now())


def daemon_client(sandbox: Sandbox) -> DaemonClient:
    return DaemonClient(parse_address(sandbox.daemon_address), decrypt_str(sandbox.daemon_secret_encrypted))


# -- running sandboxes, remembered briefly -------------------------------------------------------
#
# Every exec, read and write needs the sandbox's daemon address and secret: a query and a decryption
# that cost more than a short exec itself. This process remembers them for
# SANDBOX_LOOKUP_CACHE_SECONDS. A destroy in this process forgets the sandbox at once; one made
# elsewhere (the reaper in the worker, another web process) leaves an entry that leads to a daemon
# that is gone, and the operation then re-reads the database (streaming views, ``forget_running``)
# and answers 410 as it would have.


def _lookup_ttl() -> float:
    return float(settings.SANDBOX_LOOKUP_CACHE_SECONDS)


# sandbox id -> (organization id, daemon client)
_running: TtlCache[str, tuple[str, DaemonClient]] = TtlCache(_lookup_ttl)


def cached_daemon_client(*, organization_id: str, sandbox_id: str) -> DaemonClient | None:
    """The daemon client of a sandbox of this organization that ran a moment ago, if remembered."""
    entry = _running.get(sandbox_id)
    if entry is None or entry[0] != organization_id:
        return None
    return entry[1]


def running_daemon_client(*, principal: Principal, sandbox_id: str) -> DaemonClient:
    """The daemon client of a running sandbox of the caller's organization (404/409/410 otherwise)."""
    generation = _running.generation
    sandbox = get_running_sandbox(principal=principal, sandbox_id=sandbox_id)
    return remember_running(sandbox, generation)


def remember_running(sandbox: Sandbox, generation: int | None = None) -> DaemonClient:
    """``sandbox``'s daemon client, remembered (``generation``: when its row was read, if earlier)."""
    client = daemon_client(sandbox)
    _running.put(
        sandbox.pk, (sandbox.organization_id, client), _running.generation if generation is None else generation
    )
    return client


def forget_running(sandbox_id: str) -> None:
    _running.discard(sandbox_id)


def reconcile() -> dict[str, list[str]]:
    """Make the database and the runtime agree (at start-up and periodically).

    Sandboxes the database thinks run but the runtime lost are marked destroyed (their slot freed);
    sandboxes the runtime runs that the database does not know are orphans and are destroyed.
    """
    runtime = get_runtime()
    # Listed before the database is read: a sandbox created in between has its row committed
    # (cold starts) or reports its claim time (pool members), and is not taken for an orphan.
    known = {info.sandbox_id: info for info in runtime.list()}
    vanished: list[str] = []
    orphans: list[str] = []
    unhealthy_pool: list[str] = []
    stale = timezone.now() - STALE_CREATE
    active = {s.pk: s for s in Sandbox.objects.filter(status__in=ACTIVE_STATUSES, runtime=runtime.name)}
    for sandbox in active.values():
        info = known.get(sandbox.pk)
        if sandbox.status == SandboxStatus.CREATING:
            if info is None and sandbox.created_at < stale:
                Sandbox.objects.filter(pk=sandbox.pk, status=SandboxStatus.CREATING).update(
                    status=SandboxStatus.FAILED, failure="abandoned while starting"
                )
                vanished.append(sandbox.pk)
            continue
        if info is None or info.state != SandboxState.RUNNING:
            destroy_sandbox(sandbox=sandbox, reason=DestroyReason.VANISHED, detail=info.detail if info else "")
            vanished.append(sandbox.pk)
    now = time.time()
    for sandbox_id, info in known.items():
        if sandbox_id in active:
            continue
        if info.pooled:
            if _pool_member_unhealthy(runtime, info):
                unhealthy_pool.append(sandbox_id)
            continue
        if info.claimed_at is not None and now - info.claimed_at < STALE_CREATE.total_seconds():
            continue  # claimed from the pool a moment ago; its row is being committed
        runtime.destroy(sandbox_id)
        orphans.append(sandbox_id)
    if vanished or orphans or unhealthy_pool:
        logger.info(
            "reconciled sandboxes: vanished=%s orphans=%s unhealthy pool members=%s", vanished, orphans, unhealthy_pool
        )
    return {"vanished": vanished, "orphans": orphans, "unhealthyPool": unhealthy_pool}


def _pool_member_unhealthy(runtime: SandboxRuntime, info: SandboxInfo) -> bool:
    """Destroy a pool member that could not serve a create (its processes gone, its daemon silent)."""
    if info.state == SandboxState.STARTING:
        return False  # being started by a filler right now
    if info.state == SandboxState.RUNNING and info.handle is not None:
        try:
            asyncio.run(DaemonClient(info.handle.address, info.handle.secret, connect_timeout=2).ping())
            return False
        except Exception:
            logger.warning("warm pool member %s does not answer; destroying it", info.sandbox_id)
        # Out of the pool first, so no create can claim it while it is being destroyed.
        if runtime.claim(info.sandbox_id) is None:
            return False  # claimed by a create in the meantime: no longer the pool's to judge
    runtime.destroy(info.sandbox_id)
    return True


def reap_idle() -> list[str]:
    """Destroy sandboxes idle longer than SANDBOX_IDLE_SECONDS. Safe to run concurrently (two beat
    instances, or a slow run overlapping the next): each sandbox is destroyed once, by whichever run
    locks it first, and only if it is still idle under that lock."""
    cutoff = timezone.now() - timedelta(seconds=settings.SANDBOX_IDLE_SECONDS)
    candidates = list(
        Sandbox.objects.filter(status=SandboxStatus.RUNNING, last_activity_at__lt=cutoff).values_list("pk", flat=True)
    )
    return [sandbox_id for sandbox_id in candidates if _reap_if_still_idle(sandbox_id, cutoff)]


def _reap_if_still_idle(sandbox_id: str, cutoff: datetime) -> bool:
    # The candidates were read without a lock, and destroying the ones before this took time: an exec
    # may have started here since. Its activity write (record_activity) updates this row, so idleness
    # is decided again under the row lock, and the destroy happens inside the same transaction
    # (destroy_sandbox's own lock is then already held): no activity can land between the check and
    # the status change. On SQLite the IMMEDIATE transaction gives the same exclusion. The price is
    # that the lock is held through the runtime cleanup (about 0.1 s), which only delays writes to a
    # sandbox that is being destroyed anyway (on SQLite, every write for that long).
    with transaction.atomic():
        sandbox = (
            Sandbox.objects.select_for_update()
            .filter(pk=sandbox_id, status=SandboxStatus.RUNNING, last_activity_at__lt=cutoff)
            .first()
        )
        if sandbox is None:
            return False  # active again, or already destroyed by someone else
        return destroy_sandbox(
            sandbox=sandbox,
            reason=DestroyReason.INACTIVITY,
            detail=f"idle since {sandbox.last_activity_at.isoformat()}",
        )
