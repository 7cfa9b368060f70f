"""A keyspace with tablets is refused at open (``backend.require_no_tablets``).

Cassandra has no tablets, so the node's answers to the two schema queries a
ScyllaDB with tablets would give are put in here; everything else is the node's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from backends.scylla import backend as backend_module
from backends.scylla.schema import HAS_TABLETS
from backends.scylla.session import CqlSession
from service.domain.errors import StoreSchemaError
from tests.servers.cql_server import ScyllaHarness

pytestmark = pytest.mark.scylla


def _scylla_answers(initial_tablets: int | None) -> Callable[..., Any]:
    real = CqlSession.simple

    async def simple(self: CqlSession, cql: str, *args: Any, **kwargs: Any) -> Any:
        if cql == HAS_TABLETS:
            return [{"column_name": "initial_tablets"}]
        if cql == backend_module.KEYSPACE_TABLETS:
            return [{"initial_tablets": initial_tablets}]
        return await real(self, cql, *args, **kwargs)

    return simple


async def test_a_keyspace_with_tablets_is_refused_with_a_clear_error(
    scylla: ScyllaHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CqlSession, "simple", _scylla_answers(0))
    with pytest.raises(StoreSchemaError, match="uses tablets") as refused:
        await scylla.open()
    assert scylla.keyspace not in str(refused.value)


async def test_a_scylla_keyspace_without_tablets_opens(
    scylla: ScyllaHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CqlSession, "simple", _scylla_answers(None))
    backend = await scylla.open()
    assert backend.name == "scylla"
