"""Credentials inside a sandbox: exchanged at start, usable from inside, read-only, refreshed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from accounts.models import ApiToken, hash_token
from audit.models import AuditEvent, EventType
from sandboxes.models import Sandbox
from tests.conftest import Actor
from tests.sandboxes.conftest import exec_lines, stdout_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CALL = """python3 - <<'PY'
import json, os, urllib.request, urllib.error
config = json.load(open(os.path.expanduser("~/.svc.config")))
def call(method, path, body=None):
    request = urllib.request.Request(config["baseUrl"] + path, method=method, data=body,
        headers={"Authorization": "Bearer " + os.environ["SVC_API_KEY"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
print(json.dumps({"me": call("GET", "/api/v1/me"), "write": call("PATCH", "/api/v1/organization", b'{"name": "pwned"}'),
                  "same": os.environ["SVC_API_KEY"] == config["token"]}))
PY"""


def test_sandbox_calls_the_service_read_only(api: httpx.Client, sandbox_id: str) -> None:
    lines = exec_lines(api, sandbox_id, CALL)
    assert lines[-1] == {"type": "done", "exitCode": 0}, lines
    result = json.loads(stdout_of(lines))
    status, me = result["me"]
    assert status == 200, me
    assert me["tokenReadOnly"] is True
    status, denied = result["write"]
    assert status == 403 and denied["error"]["code"] == "read_only_token"
    assert result["same"] is True
    token = ApiToken.objects.get(sandbox_id=sandbox_id)
    assert token.read_only and token.expires_at is not None
    issued = AuditEvent.objects.get(sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_ISSUED)
    # The sandbox authenticated itself (the exchange was called from inside), not the control plane.
    assert issued.data["via"] == "sandbox"


def test_config_file_is_private_and_describes_the_sandbox(api: httpx.Client, sandbox_id: str) -> None:
    mode = stdout_of(exec_lines(api, sandbox_id, "stat -c '%a %U' ~/.svc.config")).strip()
    assert mode == "600 ubuntu"
    config = json.loads(stdout_of(exec_lines(api, sandbox_id, "cat ~/.svc.config")))
    assert config["sandboxId"] == sandbox_id
    assert set(config) >= {"baseUrl", "token", "expiresAt", "organization", "sandboxId"}
    detail = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()
    expires_at = Sandbox.objects.get(pk=sandbox_id).credentials_expires_at
    assert expires_at is not None
    assert detail["credentials"]["expiresAt"] == expires_at.isoformat()
    assert detail["credentials"]["error"] is None


def test_credentials_die_with_the_sandbox(api: httpx.Client, sandbox_id: str) -> None:
    raw = json.loads(stdout_of(exec_lines(api, sandbox_id, "cat ~/.svc.config")))["token"]
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 200
    api.delete(f"/api/v1/sandboxes/{sandbox_id}")
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 401


def test_without_network_the_control_plane_exchanges_for_the_sandbox(enabled: object, transactional_db: None) -> None:
    from tests.live import start_live_server, stop_live_server

    server = start_live_server({"SANDBOX_NETWORK": "none"})
    try:
        with httpx.Client(base_url=server.url, headers=enabled.auth, timeout=60) as client:  # type: ignore[attr-defined]
            sandbox_id = client.post("/api/v1/sandboxes").json()["id"]
            try:
                config = json.loads(stdout_of(exec_lines(client, sandbox_id, "cat ~/.svc.config")))
                assert config["sandboxId"] == sandbox_id
                assert stdout_of(exec_lines(client, sandbox_id, "printf %s $SVC_API_KEY")) == config["token"]
                # Recorded once the push is done, by then the command may have run.
                issued = wait_for(
                    lambda: AuditEvent.objects.filter(
                        sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_ISSUED
                    ).first(),
                    timeout=5,
                )
                assert issued is not None and issued.data["via"] == "control-plane"
                # With no network, the sandbox cannot use it, but nothing is silently missing.
                assert client.get(f"/api/v1/sandboxes/{sandbox_id}").json()["credentials"]["error"] is None
            finally:
                client.delete(f"/api/v1/sandboxes/{sandbox_id}")
    finally:
        stop_live_server(server)


def test_a_failed_refresh_is_visible_revoked_and_retried_until_it_succeeds(
    api: httpx.Client, sandbox_id: str, settings: Any
) -> None:
    from sandboxes import tasks

    original = json.loads(stdout_of(exec_lines(api, sandbox_id, "cat ~/.svc.config")))["token"]
    # The sandbox's own user makes its home unwritable: the daemon (the same unprivileged user) can no
    # longer install ~/.svc.config, so the push of a renewed token fails for a real reason.
    assert exec_lines(api, sandbox_id, "chmod a-w ~")[-1] == {"type": "done", "exitCode": 0}
    # Every token is due: it expires within the margin.
    settings.SANDBOX_CREDENTIALS_MARGIN_SECONDS = settings.SANDBOX_API_TOKEN_SECONDS + 60

    assert tasks.refresh_credentials() == {sandbox_id: False}

    failed = AuditEvent.objects.get(sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_REFRESH_FAILED)
    assert "Permission denied" in failed.data["error"]
    revoked = ApiToken.objects.get(sandbox_id=sandbox_id, prefix=failed.data["revokedTokenPrefix"])
    assert revoked.revoked_at is not None, "the token that never reached the sandbox is not left alive"
    assert list(
        ApiToken.objects.filter(sandbox_id=sandbox_id, revoked_at__isnull=True).values_list("token_hash", flat=True)
    ) == [hash_token(original)], "the installed token is the only live one"
    error = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()["credentials"]["error"]
    assert error and error.startswith("credential refresh failed") and "Permission denied" in error
    # The sandbox keeps working with what it has.
    assert json.loads(stdout_of(exec_lines(api, sandbox_id, "cat ~/.svc.config")))["token"] == original
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {original}"}).status_code == 200

    # With the usual margin the token is not due by its expiry any more: only the recorded failure
    # keeps the sandbox in the next run, which succeeds once the home is writable again.
    settings.SANDBOX_CREDENTIALS_MARGIN_SECONDS = 600
    assert exec_lines(api, sandbox_id, "chmod u+w ~")[-1] == {"type": "done", "exitCode": 0}
    assert tasks.refresh_credentials() == {sandbox_id: True}

    assert api.get(f"/api/v1/sandboxes/{sandbox_id}").json()["credentials"]["error"] is None
    renewed = json.loads(stdout_of(exec_lines(api, sandbox_id, "cat ~/.svc.config")))["token"]
    assert renewed != original
    assert stdout_of(exec_lines(api, sandbox_id, "printf %s $SVC_API_KEY")) == renewed
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {renewed}"}).status_code == 200
    refreshed = AuditEvent.objects.filter(sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_ISSUED)
    assert refreshed.filter(data__via="refresh").count() == 1
    # Healthy again: nothing is due until the new token nears its expiry.
    assert tasks.refresh_credentials() == {}


def test_a_sandbox_whose_first_exchange_was_lost_is_due_for_refresh(enabled: Actor) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from sandboxes.credentials import PROVISIONING_GRACE, due_for_refresh
    from sandboxes.models import SandboxStatus

    def running(age: timedelta, **fields: Any) -> str:
        sandbox = Sandbox.objects.create(
            organization=enabled.organization,
            created_by=enabled.user,
            runtime="local",
            status=SandboxStatus.RUNNING,
            last_activity_at=timezone.now(),
            **fields,
        )
        Sandbox.objects.filter(pk=sandbox.pk).update(created_at=timezone.now() - age)
        return str(sandbox.pk)

    lost = running(PROVISIONING_GRACE + timedelta(seconds=5))
    # Still within its create's own exchange: not the refresh job's yet.
    provisioning = running(timedelta(seconds=1))
    healthy = running(PROVISIONING_GRACE * 2, credentials_expires_at=timezone.now() + timedelta(seconds=3600))
    due = {sandbox.pk for sandbox in due_for_refresh()}
    assert lost in due
    assert provisioning not in due
    assert healthy not in due


def test_a_sandbox_destroyed_at_once_logs_its_credentials_before_its_destroy(api: httpx.Client) -> None:
    # Recording a successful exchange waits a moment (so it does not compete with the first
    # command); a destroy within that moment records it first, so the log keeps the real order.
    sandbox_id = api.post("/api/v1/sandboxes").json()["id"]
    assert stdout_of(exec_lines(api, sandbox_id, 'echo "${SVC_API_KEY:0:4}"')).strip() == "svc_"
    assert api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    listed = api.get(f"/api/v1/sandboxes/{sandbox_id}/audit-logs").json()["results"]
    types = [event["type"] for event in reversed(listed) if event["type"] != EventType.EXEC]
    assert types == [EventType.SANDBOX_CREATE, EventType.CREDENTIALS_ISSUED, EventType.SANDBOX_DESTROY]
    issued = next(event for event in listed if event["type"] == EventType.CREDENTIALS_ISSUED)
    assert issued["data"]["via"] == "sandbox"
    # Its token died with it.
    assert ApiToken.objects.get(sandbox_id=sandbox_id).revoked_at is not None


def test_the_audit_log_keeps_the_order_things_happened_in(api: httpx.Client) -> None:
    # The exchange's event is recorded a moment after it (so it does not compete with the first
    # command) and exec events in batches; each still carries the time it happened, so the log
    # reads create, credentials, then the commands in the order they ran.
    sandbox_id = api.post("/api/v1/sandboxes").json()["id"]
    for word in ("first", "second"):
        assert stdout_of(exec_lines(api, sandbox_id, f"echo {word}")) == f"{word}\n"
    deadline = time.monotonic() + 10
    while True:
        listed = api.get(f"/api/v1/sandboxes/{sandbox_id}/audit-logs").json()["results"]
        if len(listed) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    in_order = list(reversed(listed))
    assert [event["type"] for event in in_order] == [
        EventType.SANDBOX_CREATE,
        EventType.CREDENTIALS_ISSUED,
        EventType.EXEC,
        EventType.EXEC,
    ]
    assert [event["data"]["command"] for event in in_order[2:]] == ["echo first", "echo second"]
    api.delete(f"/api/v1/sandboxes/{sandbox_id}")


def _unsaved_sandbox(enabled: Actor, sandbox_id: str) -> Sandbox:
    from django.utils import timezone

    from sandboxes.models import SandboxStatus

    return Sandbox(
        id=sandbox_id,
        organization=enabled.organization,
        created_by=enabled.user,
        status=SandboxStatus.RUNNING,
        runtime="local",
        last_activity_at=timezone.now(),
    )


def _exchange_during_create(
    identity: str, in_create: Callable[[], None], *, commit: bool, after: Callable[[bool], None] = lambda _: None
) -> dict[str, Any]:
    """Exchange ``identity`` while a create's transaction (``in_create``, then commit or rollback,
    then ``after(committed)``) is still open; asserts the exchange waited for it. The exchange's
    answer is ``issued``, or its refusal ``error``."""
    import threading

    from django.db import connections, transaction

    from accounts import oidc
    from accounts.services import exchange_identity_token

    in_transaction, release = threading.Event(), threading.Event()
    events: list[str] = []

    class RollbackError(Exception):
        pass

    def create() -> None:
        try:
            try:
                with transaction.atomic():
                    in_create()
                    in_transaction.set()
                    release.wait(10)
                    events.append("create ended")
                    if not commit:
                        raise RollbackError
            except RollbackError:
                after(False)
            else:
                after(True)
        finally:
            connections.close_all()

    creator = threading.Thread(target=create)
    creator.start()
    assert in_transaction.wait(10)
    result: dict[str, Any] = {}

    def exchange() -> None:
        try:
            result["issued"] = exchange_identity_token(subject_token=identity)
        except oidc.IdentityTokenError as exc:
            result["error"] = exc
        finally:
            events.append("exchange answered")
            connections.close_all()

    exchanger = threading.Thread(target=exchange)
    exchanger.start()
    exchanger.join(0.5)
    assert exchanger.is_alive(), "the exchange answered while the create was still open"
    release.set()
    creator.join(10)
    exchanger.join(10)
    assert events == ["create ended", "exchange answered"]
    return result


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_exchange_waits_for_the_create_of_its_sandbox(enabled: Actor, outcome: str) -> None:
    """A create hands its sandbox the identity token before committing the row: an exchange
    arriving meanwhile waits for that commit and gets a token, or is refused if the create rolled
    back (never a token for a sandbox that does not exist)."""
    from accounts.models import Organization
    from sandboxes import credentials

    sandbox = _unsaved_sandbox(enabled, "sbx_inflightcreate0000000000")

    def create() -> None:
        Organization.objects.select_for_update().get(pk=enabled.organization.pk)
        sandbox.save(force_insert=True)

    result = _exchange_during_create(credentials.identity_token(sandbox), create, commit=outcome == "commit")
    if outcome == "commit":
        assert result["issued"].token.sandbox_id == sandbox.pk
        assert result["issued"].token.read_only
    else:
        assert "issued" not in result
        assert "unknown" in str(result["error"])
        assert not ApiToken.objects.filter(sandbox_id=sandbox.pk).exists()


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_prepared_answer_waits_for_its_commit_and_is_given_once(enabled: Actor, outcome: str) -> None:
    """The create prepares the answer to its sandbox's first exchange (the token row, in its own
    transaction): the exchange of exactly that identity token waits for the commit and answers with
    that token, once; after a rollback it is refused like any exchange of an unknown sandbox."""
    from accounts.services import exchange_identity_token, issue_sandbox_token, prepare_exchange
    from sandboxes import credentials

    sandbox = _unsaved_sandbox(enabled, "sbx_preparedanswer0000000000")
    identity = credentials.identity_token(sandbox)
    prepared = prepare_exchange(subject_token=identity, expires_at=time.time() + 60)

    def create() -> None:
        sandbox.save(force_insert=True)
        prepared.issued = issue_sandbox_token(
            user=enabled.user, organization=enabled.organization, sandbox_id=sandbox.pk
        )

    def settle(committed: bool) -> None:
        prepared.settle(prepared.issued if committed else None)

    result = _exchange_during_create(identity, create, commit=outcome == "commit", after=settle)
    if outcome == "commit":
        assert prepared.issued is not None
        assert result["issued"].raw == prepared.issued.raw
        assert ApiToken.objects.filter(sandbox_id=sandbox.pk).count() == 1, "the exchange issued nothing more"
        assert prepared.withdraw() is None, "an answer given is not the withdrawer's to revoke"
        # Presented again, the token gets the ordinary exchange: a token of its own.
        again = exchange_identity_token(subject_token=identity)
        assert again.raw != prepared.issued.raw and again.token.sandbox_id == sandbox.pk
    else:
        assert "issued" not in result
        assert "unknown" in str(result["error"])
        assert not ApiToken.objects.filter(sandbox_id=sandbox.pk).exists()
        assert prepared.withdraw() is None


def test_a_prepared_answer_goes_only_to_its_own_unexpired_token(enabled: Actor) -> None:
    """Another identity token of the same sandbox, or the prepared one once its answer has expired
    or been withdrawn, takes the ordinary exchange; the withdrawer gets the unused token back."""
    from accounts.services import exchange_identity_token, issue_sandbox_token, prepare_exchange
    from sandboxes import credentials

    sandbox = _unsaved_sandbox(enabled, "sbx_preparedanswer1111111111")
    sandbox.save(force_insert=True)

    def prepared_for(identity: str, expires_at: float) -> Any:
        prepared = prepare_exchange(subject_token=identity, expires_at=expires_at)
        issued = issue_sandbox_token(user=enabled.user, organization=enabled.organization, sandbox_id=sandbox.pk)
        prepared.settle(issued)
        return prepared

    identity = credentials.identity_token(sandbox)
    prepared = prepared_for(identity, time.time() + 60)
    other = exchange_identity_token(subject_token=credentials.identity_token(sandbox))
    assert other.raw != prepared.issued.raw
    unused = prepared.withdraw()
    assert unused is not None and unused.raw == prepared.issued.raw
    assert exchange_identity_token(subject_token=identity).raw != prepared.issued.raw

    stale_identity = credentials.identity_token(sandbox)
    stale = prepared_for(stale_identity, time.time() - 1)
    assert exchange_identity_token(subject_token=stale_identity).raw != stale.issued.raw
    assert stale.withdraw() is stale.issued, "not given, so still the withdrawer's"


def test_an_exchange_answered_by_another_web_process_leaves_one_live_token(
    enabled: Actor, transactional_db: None
) -> None:
    """With several web processes, a sandbox's exchange may reach one that did not create it: that
    one issues a token of its own, and the creator revokes the answer it had prepared. The sandbox
    ends with one live token, the one it installed. Here every exchange goes to the other process:
    the creating one gives its sandboxes the other's address, and forwards that port into them."""
    from tests.live import start_live_server, stop_live_server

    other = start_live_server()
    # One deployment: the same issuer (its base URL) and signing keys, the database shared.
    creator = start_live_server({"BASE_URL": other.url, "SANDBOX_SERVICE_URL": other.url})
    created: list[str] = []
    try:
        with httpx.Client(base_url=creator.url, headers=enabled.auth, timeout=60) as client:
            for _ in range(3):
                created.append(client.post("/api/v1/sandboxes").json()["id"])
            for sandbox_id in created:
                installed = stdout_of(exec_lines(client, sandbox_id, "printf %s $SVC_API_KEY"))
                # The creator records the outcome a moment after it, revoking what it prepared.
                wait_for(
                    lambda sandbox_id=sandbox_id: AuditEvent.objects.filter(  # type: ignore[misc]
                        sandbox_id=sandbox_id, event_type=EventType.CREDENTIALS_ISSUED, data__via="sandbox"
                    ).exists(),
                    timeout=10,
                )
                tokens = ApiToken.objects.filter(sandbox_id=sandbox_id)
                assert tokens.count() == 2, "the other process issued its own token"
                live = tokens.filter(revoked_at__isnull=True)
                assert list(live.values_list("token_hash", flat=True)) == [hash_token(installed)]
                assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {installed}"}).status_code == 200
    finally:
        with httpx.Client(base_url=creator.url, headers=enabled.auth, timeout=60) as client:
            for sandbox_id in created:
                client.delete(f"/api/v1/sandboxes/{sandbox_id}")
        stop_live_server(creator)
        stop_live_server(other)
