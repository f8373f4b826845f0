from __future__ import annotations

import httpx

from tests.conftest import Actor
from tests.live import LiveServer


def test_live_server_sees_committed_test_data(live: LiveServer, owner: Actor) -> None:
    response = httpx.get(f"{live.url}/api/v1/me", headers=owner.auth, timeout=10)
    assert response.status_code == 200, live.log()
    assert response.json()["user"]["email"] == owner.user.email
    static = httpx.get(f"{live.url}/static/css/app.css", timeout=10)
    assert static.status_code == 200
