"""Which host port the local runtime forwards into sandboxes: the one the service is reached on."""

from __future__ import annotations

import pytest

from sandboxes.runtime import service_port


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("http://127.0.0.1:8000", 8000),  # the default: PORT
        ("http://localhost:8443", 8443),  # a proxy on this host in front of the service
        ("https://127.0.0.1", 443),
        ("http://[::1]", 80),
        ("https://svc.example.com", None),  # another host: reached over the outbound network
    ],
)
def test_the_forwarded_port_is_the_one_the_service_url_names(url: str, port: int | None) -> None:
    assert service_port(url) == port
