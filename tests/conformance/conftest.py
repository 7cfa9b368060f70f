"""One backend fixture for the whole conformance suite.

Every test here runs once per backend; each case carries the backend's
marker, so ``pytest -m redis tests/conformance`` runs Redis's cases only.
The Redis and Scylla harnesses come from the server plugins in
``tests/servers/``, which start real servers (never skipped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backends.memory import MemoryState, open_memory_backend
from service.domain.delivery import DeliverySettings
from service.domain.ports import Backend, Clock, StoreSettings
from tests.conformance.harness import Harness, IdentityForm


class MemoryHarness(Harness):
    """Reopening shares the MemoryState, as a process that never stopped would."""

    name = "memory"
    durable = False

    def __init__(self) -> None:
        super().__init__()
        self._state = MemoryState()

    async def _open(
        self,
        *,
        clock: Clock | None,
        settings: StoreSettings | None,
        identity_form: IdentityForm,
        delivery: DeliverySettings | None = None,
    ) -> Backend:
        chosen = delivery or DeliverySettings()
        return open_memory_backend(
            self._state,
            settings,
            clock,
            identity_form,
            chosen.mailbox,
            chosen.dead_letter_retention_ms,
        )


@pytest.fixture
def memory_harness() -> MemoryHarness:
    return MemoryHarness()


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.memory),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("scylla", marks=pytest.mark.scylla),
        # a three-node cluster, RF 3, QUORUM / SERIAL (tests/servers/cql_cluster.py)
        pytest.param("scylla_cluster", marks=pytest.mark.cluster),
        # Redis behind Sentinel and a Redis Cluster (tests/servers/redis_topologies.py)
        pytest.param("redis_sentinel", marks=[pytest.mark.redis, pytest.mark.cluster]),
        pytest.param("redis_cluster", marks=[pytest.mark.redis, pytest.mark.cluster]),
    ]
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    chosen: Harness = request.getfixturevalue(f"{request.param}_harness")
    try:
        yield chosen
    finally:
        await chosen.close_all()
