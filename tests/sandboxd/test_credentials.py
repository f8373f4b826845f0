"""Credentials fetched in the background of a create: new commands wait for them."""

from __future__ import annotations

import asyncio

import pytest

from sandboxes.daemon_client import DaemonClient, DaemonError
from tests.runtimes.conftest import ServiceStub, _Handler


def _exchange_url(stub: ServiceStub, path: str) -> str:
    # Inside the sandbox the service's port is forwarded to the host's (the runtime's service_port).
    return f"http://127.0.0.1:{stub.port}{path}"


async def test_a_background_exchange_holds_new_commands_until_the_token_is_in(
    client: DaemonClient, service_stub: ServiceStub
) -> None:
    accepted = asyncio.Event()
    exchange = asyncio.ensure_future(
        client.exchange_credentials(
            url=_exchange_url(service_stub, "/slow-exchange"),
            identity_token="identity",
            base_url="http://service",
            on_accepted=accepted.set,
        )
    )
    await asyncio.wait_for(accepted.wait(), 10)
    # Sent while the exchange is still waiting for its answer (the stub takes half a second):
    # the command only starts once the token is installed, so it sees it.
    result = await client.run('echo "$SVC_API_KEY"')
    assert result.text == _Handler.exchanged_token + "\n"
    answer = await exchange
    assert answer["type"] == "ok"
    assert answer["expiresIn"] == 600


async def test_after_a_failed_background_exchange_commands_wait_for_the_control_planes_push(
    client: DaemonClient, service_stub: ServiceStub
) -> None:
    accepted = asyncio.Event()
    with pytest.raises(DaemonError) as failed:
        await client.exchange_credentials(
            url=_exchange_url(service_stub, "/failing-exchange"),
            identity_token="identity",
            base_url="http://service",
            on_accepted=accepted.set,
        )
    assert failed.value.code == "exchange_failed"
    assert accepted.is_set()
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
