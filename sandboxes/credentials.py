"""Credentials inside a sandbox: a read-only, sandbox-bound API token in ~/.svc.config and SVC_API_KEY.

At start the sandbox's daemon presents an identity token (signed by this service's OIDC issuer) to the
RFC 8693 exchange from inside the sandbox. When the sandbox cannot reach the service (no network on
this host), the control plane pushes the token that exchange would have answered with, so the
credential is identical either way. Renewal is the control plane's: a new token is issued before the
old one expires and pushed through the daemon; the old one simply runs out.

The first exchange runs in the background of the create (``start_provisioning``): the create answers
as soon as the daemon holds new commands until the token is in place, so the exchange's round trip
overlaps the client's next request instead of adding to the create, and the first exec still sees
``SVC_API_KEY``. The create hands the exchange over before it commits (``send_exchange``) and
prepares its answer in the same transaction (``FirstExchange``, ``accounts.services.PreparedExchange``):
the exchange waits for that commit and then answers without verifying, looking up or writing
anything again. The sandbox's ``credentials`` detail fills in a few milliseconds later.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from accounts import oidc
from accounts.models import ApiToken, Organization
from accounts.services import (
    IssuedToken,
    PreparedExchange,
    exchange_identity_token,
    issue_sandbox_token,
    prepare_exchange,
    revoke_token,
)
from audit.models import EventType
from audit.services import record_event
from sandboxd.workers import Workers
from sandboxes.daemon_client import DaemonClient, DaemonError, PendingExchange
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus

logger = logging.getLogger(__name__)

CONFIG_FILE = "~/.svc.config"

# How long a create waits for the daemon to take the background exchange on (it answers at once
# unless the sandbox is gone or wedged; the control plane then runs the exchange for it).
ACCEPT_WAIT_SECONDS = 5.0
# How long the exchange's outcome may take: the daemon's own limit on it, with a margin.
OUTCOME_WAIT_SECONDS = 15.0
# How long recording a successful exchange waits (see _finish_provisioning).
RECORD_DELAY_SECONDS = 0.2
# A running sandbox without credentials this long after its create lost its first exchange (the
# process that ran it died): the refresh job issues them.
PROVISIONING_GRACE = timedelta(minutes=1)


def identity_claims(sandbox: Sandbox) -> dict[str, Any]:
    return {"sandbox_id": sandbox.pk, "org": sandbox.organization_id, "creator": sandbox.created_by_id}


def identity_token(sandbox: Sandbox) -> str:
    return oidc.issue_identity_token(subject=f"sandbox:{sandbox.pk}", claims=identity_claims(sandbox))


def resolve_sandbox_subject(claims: dict[str, Any]) -> oidc.ExchangeSubject | None:
    """Identity claims → the live sandbox they name (registered with the token exchange)."""
    sandbox_id, organization_id = claims.get("sandbox_id"), claims.get("org")
    if not isinstance(sandbox_id, str) or not isinstance(organization_id, str):
        return None
    # A create from the warm pool hands its sandbox the identity token before it commits the
    # sandbox's row, holding its organization's lock until then: once that lock is ours, the row is
    # visible if it was committed at all. (On SQLite the exchange's IMMEDIATE transaction waits for
    # the create's in the same way, so there is nothing to lock.)
    if connection.features.has_select_for_update:
        Organization.objects.select_for_update().filter(pk=organization_id).exists()
    # get(), not first(): the pk names one row, and first()'s ordering is work for nothing on every
    # sandbox's start.
    try:
        created_by_id = Sandbox.objects.values_list("created_by_id", flat=True).get(
            pk=sandbox_id, organization_id=organization_id, status__in=ACTIVE_STATUSES
        )
    except Sandbox.DoesNotExist:
        return None
    if created_by_id is None:
        return None
    return oidc.ExchangeSubject(user_id=created_by_id, organization_id=organization_id, sandbox_id=sandbox_id)


def config_document(sandbox: Sandbox, organization: Organization, issued: IssuedToken) -> dict[str, Any]:
    """The ~/.svc.config every SDK and CLI of the service reads (JSON, mode 600, owned by ubuntu)."""
    assert issued.token.expires_at is not None
    return {
        "baseUrl": settings.SANDBOX_SERVICE_URL,
        "token": issued.raw,
        "expiresAt": issued.token.expires_at.isoformat(),
        "organization": {"id": organization.pk, "slug": organization.slug},
        "sandboxId": sandbox.pk,
        "userId": sandbox.created_by_id,
    }


def _push(sandbox: Sandbox, issued: IssuedToken) -> None:
    from sandboxes.services import daemon_client

    document = config_document(sandbox, sandbox.organization, issued)
    client = daemon_client(sandbox)
    asyncio.run(client.update_credentials({"SVC_API_KEY": issued.raw, "SVC_BASE_URL": document["baseUrl"]}, document))


@dataclass
class FirstExchange:
    """A sandbox's first exchange, handed to its daemon: its answer prepared in this process
    (``accounts.services.PreparedExchange``) and what sending it gave (or the error it raised)."""

    prepared: PreparedExchange
    sent: PendingExchange | Exception

    def issue(self, sandbox: Sandbox) -> None:
        """Issue the token the exchange answers with, in the caller's transaction; ``settle`` once
        that transaction has committed (``abandon`` if it did not)."""
        assert sandbox.created_by is not None
        self.prepared.issued = issue_sandbox_token(
            user=sandbox.created_by, organization=sandbox.organization, sandbox_id=sandbox.pk
        )

    def settle(self) -> None:
        self.prepared.settle(self.prepared.issued)

    def abandon(self) -> None:
        """The sandbox goes away before its provisioning started: nothing of the exchange stays (an
        exchange waiting for the answer takes the ordinary path, which refuses it)."""
        self.prepared.settle(None)
        self.prepared.withdraw()
        if isinstance(self.sent, PendingExchange):
            self.sent.close()

    def revoke_unused(self) -> None:
        """Offer the answer no more, and revoke its token unless an exchange gave it out: the
        sandbox got a token elsewhere (another web process answered), or got none."""
        unused = self.prepared.withdraw()
        if unused is not None:
            revoke_token(token=unused.token)


def send_exchange(sandbox: Sandbox, client: DaemonClient) -> FirstExchange:
    """Hand the daemon the sandbox's own exchange, without waiting for its answer.

    A create from the warm pool calls this before its transaction commits the sandbox's row (and
    the token the exchange answers with, ``FirstExchange.issue``), so the exchange's round trip
    overlaps the commit; the exchange waits for that commit. ``start_provisioning`` then reads the
    daemon's ``accepted``.
    """
    extra = {
        "organization": {"id": sandbox.organization_id, "slug": sandbox.organization.slug},
        "sandboxId": sandbox.pk,
        "userId": sandbox.created_by_id,
    }
    # Taken a second early, so the prepared answer never outlives the token it answers.
    expires_at = time.time() + settings.SANDBOX_IDENTITY_TOKEN_SECONDS - 1
    identity = identity_token(sandbox)
    prepared = prepare_exchange(subject_token=identity, expires_at=expires_at)
    sent: PendingExchange | Exception
    try:
        sent = client.send_exchange(
            url=f"{settings.SANDBOX_SERVICE_URL}/api/v1/auth/token-exchange",
            identity_token=identity,
            base_url=settings.SANDBOX_SERVICE_URL,
            config=extra,
            timeout=ACCEPT_WAIT_SECONDS,
        )
    except Exception as exc:
        sent = exc
    return FirstExchange(prepared, sent)


def _finish_provisioning(sandbox: Sandbox, first: FirstExchange, begun: PendingExchange | Exception) -> str:
    """Wait for the sandbox's own exchange and record it; returns how ("sandbox" or "control-plane").

    Where the sandbox could not exchange its token (a host without user-mode networking, the
    exchange refused, the daemon not taking it on), the control plane pushes the token the exchange
    would have answered with: the daemon keeps holding new commands for that push.
    """
    if isinstance(begun, PendingExchange):
        try:
            begun.outcome(OUTCOME_WAIT_SECONDS)
        except DaemonError as exc:
            begun = exc
        else:
            # Another process may have answered the exchange with a token of its own: one live credential.
            first.revoke_unused()
            # The token is in place and the sandbox's first command, usually sent right after the
            # create, is running now: the bookkeeping waits rather than compete with it.
            with _waiting_lock:
                _waiting[sandbox.pk] = sandbox
            time.sleep(RECORD_DELAY_SECONDS)
            record_waiting(sandbox.pk)
            return "sandbox"
    if not isinstance(begun, DaemonError):
        first.revoke_unused()
        raise begun
    logger.info("sandbox %s could not exchange its own token (%s); the control plane does it", sandbox.pk, begun)
    issued = first.prepared.withdraw()
    if issued is None:
        # The exchange was answered but the daemon failed to install the answer (or there was none
        # to give): that token goes, a new exchange gives the one pushed.
        if first.prepared.issued is not None:
            revoke_token(token=first.prepared.issued.token)
        issued = exchange_identity_token(subject_token=identity_token(sandbox))
    _push(sandbox, issued)
    _record_issued(sandbox, issued.token, via="control-plane")
    return "control-plane"


# The threads that wait for first exchanges' outcomes, kept between creates: starting one waits until
# it runs, which the create's answer would wait for (see sandboxd.workers).
_provisioners = Workers(lambda job: job(), name="credentials")


def start_provisioning(sandbox: Sandbox, first: FirstExchange) -> None:
    """Give a just-started sandbox its credentials, without waiting for them.

    Returns once the daemon holds new commands until they are in place (it took the sandbox's own
    ``first`` exchange on, sent and settled by the create); a worker thread waits for the outcome
    and records it, or has the control plane push the token instead. A failure is recorded on the
    sandbox (``credentials.error``) and left to the refresh job.
    """
    # A copy of its own (with the organization loaded): the create goes on changing and
    # serializing the caller's instance.
    assert sandbox.organization is not None
    sandbox = copy.copy(sandbox)
    begun: PendingExchange | Exception
    try:
        if isinstance(first.sent, Exception):
            raise first.sent
        first.sent.accepted(ACCEPT_WAIT_SECONDS)
        begun = first.sent
    except Exception as exc:
        # The thread decides: the control plane's push for a daemon that did not take it on, a
        # recorded failure otherwise. The create goes on either way.
        begun = exc

    def run() -> None:
        try:
            _finish_provisioning(sandbox, first, begun)
        except Exception as exc:
            # The sandbox works without them; the failure is on its detail and the refresh job retries.
            logger.exception("sandbox %s: credentials could not be provisioned", sandbox.pk)
            Sandbox.objects.filter(pk=sandbox.pk).update(credentials_error=f"provisioning failed: {exc}"[:2000])
        finally:
            # This thread's own database connections: it may wait idle for a long time, and
            # nothing else would ever close them.
            connections.close_all()

    _provisioners.dispatch(run)


# Sandboxes whose own exchange succeeded and is not recorded yet (see _finish_provisioning).
_waiting: dict[str, Sandbox] = {}
_waiting_lock = threading.Lock()


def record_waiting(sandbox_id: str) -> None:
    """Record the sandbox's own exchange now, if its recording is still waiting.

    A destroy calls this first, so the audit log keeps the order things happened in (credentials
    issued, then destroyed) however soon after its create a sandbox goes.
    """
    with _waiting_lock:
        sandbox = _waiting.pop(sandbox_id, None)
    if sandbox is not None:
        # Revoked or not by now (a destroy in another process): the newest is the one it exchanged.
        _record_issued(sandbox, ApiToken.objects.filter(sandbox_id=sandbox_id).latest("created_at"), via="sandbox")


@transaction.atomic
def _record_issued(sandbox: Sandbox, token: ApiToken, *, via: str) -> None:
    # A destroyed sandbox has no credentials any more; the event still says what was issued.
    Sandbox.objects.filter(pk=sandbox.pk, status__in=ACTIVE_STATUSES).update(
        credentials_expires_at=token.expires_at, credentials_error=""
    )
    record_event(
        organization=sandbox.organization,
        event_type=EventType.CREDENTIALS_ISSUED,
        sandbox_id=sandbox.pk,
        # When the token was issued: a sandbox's own exchange is recorded a moment later, and its
        # first command may be in the log already.
        at=token.created_at,
        data={
            "via": via,
            "tokenPrefix": token.prefix,
            "expiresAt": token.expires_at.isoformat() if token.expires_at else None,
        },
    )


def refresh(sandbox: Sandbox) -> bool:
    """Issue a new token and push it; on failure record why and leave the next run to retry."""
    if sandbox.created_by is None:
        return False
    issued = issue_sandbox_token(user=sandbox.created_by, organization=sandbox.organization, sandbox_id=sandbox.pk)
    try:
        _push(sandbox, issued)
    except Exception as exc:
        # The new token never reached the sandbox: revoke it so only one live credential exists. The
        # old one stays in place and valid until its own expiry; the error keeps the sandbox due, so
        # every following run retries until a push succeeds and clears it.
        revoke_token(token=issued.token)
        message = f"credential refresh failed: {exc}"
        Sandbox.objects.filter(pk=sandbox.pk).update(credentials_error=message[:2000])
        record_event(
            organization=sandbox.organization,
            event_type=EventType.CREDENTIALS_REFRESH_FAILED,
            sandbox_id=sandbox.pk,
            data={"error": str(exc)[:2000], "revokedTokenPrefix": issued.token.prefix},
        )
        logger.warning("sandbox %s: %s", sandbox.pk, message)
        return False
    _record_issued(sandbox, issued.token, via="refresh")
    return True


def due_for_refresh() -> list[Sandbox]:
    now = timezone.now()
    margin = now + timedelta(seconds=settings.SANDBOX_CREDENTIALS_MARGIN_SECONDS)
    lost = Q(credentials_expires_at__isnull=True, created_at__lt=now - PROVISIONING_GRACE)
    return list(
        Sandbox.objects.filter(status=SandboxStatus.RUNNING)
        .filter(Q(credentials_expires_at__lt=margin) | Q(credentials_error__gt="") | lost)
        .select_related("organization", "created_by")
    )


oidc.register_subject_resolver(resolve_sandbox_subject)
