"""Credentials fetched in the background of a create: new commands wait for them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandboxes.daemon_client import DaemonClient, DaemonError, DaemonUnavailable, PendingExchange
from sandboxes.runtimes.base import DaemonAddress
from tests.runtimes.conftest import ServiceStub, _Handler


def _begin_exchange(client: DaemonClient, *, url: str, identity_token: str, base_url: str) -> PendingExchange:
    """The exchange as a create hands it over: sent, then taken on (``accepted``)."""
    pending = client.send_exchange(url=url, identity_token=identity_token, base_url=base_url)
    pending.accepted(5)
    return pending


def _exchange_url(stub: ServiceStub, path: str) -> str:
    # Inside the sandbox the service's port is forwarded to the host's (the runtime's service_port).
    return f"http://127.0.0.1:{stub.port}{path}"


async def test_a_background_exchange_holds_new_commands_until_the_token_is_in(
    client: DaemonClient, service_stub: ServiceStub
) -> None:
    pending = await asyncio.to_thread(
        _begin_exchange,
        client,
        url=_exchange_url(service_stub, "/slow-exchange"),
        identity_token="identity",
        base_url="http://service",
    )
    # Sent while the exchange is still waiting for its answer (the stub takes half a second):
    # the command only starts once the token is installed, so it sees it.
    result = await client.run('echo "$SVC_API_KEY"')
    assert result.text == _Handler.exchanged_token + "\n"
    answer = await asyncio.to_thread(pending.outcome, 10)
    assert answer["type"] == "ok"
    assert answer["expiresIn"] == 600


async def test_after_a_failed_background_exchange_commands_wait_for_the_control_planes_push(
    client: DaemonClient, service_stub: ServiceStub
) -> None:
    pending = await asyncio.to_thread(
        _begin_exchange,
        client,
        url=_exchange_url(service_stub, "/failing-exchange"),
        identity_token="identity",
        base_url="http://service",
    )
    with pytest.raises(DaemonError) as failed:
        await asyncio.to_thread(pending.outcome, 10)
    assert failed.value.code == "exchange_failed"
    assert "refused (500)" in failed.value.message
    held = asyncio.ensure_future(client.run('echo "$SVC_API_KEY"'))
    await asyncio.sleep(0.3)
    assert not held.done()  # still held: the control plane has not pushed anything yet
    await client.update_credentials({"SVC_API_KEY": "pushed-by-the-control-plane"})
    result = await asyncio.wait_for(held, 10)
    assert result.text == "pushed-by-the-control-plane\n"


async def test_a_plain_exchange_holds_nothing(client: DaemonClient) -> None:
    # Without a background exchange under way, commands start at once (whatever came before).
    await client.update_credentials({"SVC_API_KEY": "plain"})
    result = await asyncio.wait_for(client.run('echo "$SVC_API_KEY"'), 5)
    assert result.text == "plain\n"


async def test_an_unreachable_exchange_says_so(client: DaemonClient) -> None:
    # Nothing listens on port 9 inside the sandbox: the exchange fails at once, with the reason.
    pending = await asyncio.to_thread(
        _begin_exchange, client, url="http://127.0.0.1:9/exchange", identity_token="identity", base_url="http://service"
    )
    with pytest.raises(DaemonError) as failed:
        await asyncio.to_thread(pending.outcome, 10)
    assert failed.value.code == "exchange_failed"
    assert "unreachable" in failed.value.message
    await client.update_credentials({"SVC_API_KEY": "after"})  # the control plane's push ends the hold


def test_a_daemon_that_is_gone_cannot_take_an_exchange_on(tmp_path: Path) -> None:
    # What the create hands to the control plane's own exchange instead (credentials.start_provisioning).
    gone = DaemonClient(DaemonAddress(unix_path=str(tmp_path / "no-daemon.sock")), "secret")
    with pytest.raises(DaemonUnavailable, match="cannot reach the sandbox daemon"):
        gone.send_exchange(url="http://service/x", identity_token="identity", base_url="http://service")
