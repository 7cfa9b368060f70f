"""Pytest plugin: a toxiproxy-server (listed in ``tests/conftest.py``).

``toxiproxy_server`` (session) runs ``toxiproxy-server`` from ``.tools/bin``
(``scripts/install-tools.sh`` builds it from the Go module proxy); a missing binary
fails the tests, never skips them. ``toxiproxy`` (per test) is its client; every
proxy the test created is deleted afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from toolkit.nemesis.toxiproxy import Toxiproxy, ToxiproxyError, ToxiproxyServer


@pytest.fixture(scope="session")
def toxiproxy_server() -> Iterator[ToxiproxyServer]:
    try:
        server = ToxiproxyServer()
        server.start()
    except ToxiproxyError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[Toxiproxy]:
    client = toxiproxy_server.client
    yield client
    with contextlib.suppress(ToxiproxyError):
        for name in client.proxies():
            client.delete_proxy(name)
