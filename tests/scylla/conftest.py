"""Fixtures of the Scylla-specific suite (the CQL server comes from tests/servers/cql_server.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backends.scylla.store import ScyllaMessageStore
from service.domain.ports import Backend
from tests.servers.cql_server import ScyllaHarness


@pytest.fixture
async def scylla(scylla_harness: ScyllaHarness) -> AsyncIterator[ScyllaHarness]:
    """The harness, with every backend it opened closed afterwards."""
    try:
        yield scylla_harness
    finally:
        await scylla_harness.close_all()


def store_of(backend: Backend) -> ScyllaMessageStore:
    assert isinstance(backend.store, ScyllaMessageStore)
    return backend.store
