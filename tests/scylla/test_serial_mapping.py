"""The service's SERIAL / LOCAL_SERIAL choice reaches the driver (issue 24 item 9).

The old check read ``serve --help`` only, and would pass with the bootstrap
mapping inverted; this one opens the backend the way ``serve`` does and reads
the serial consistency of the driver's own execution profile.
"""

from __future__ import annotations

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT

from service.bootstrap import open_backend
from service.config import ServiceConfig
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness

pytestmark = pytest.mark.scylla


@pytest.mark.parametrize(
    ("single_dc", "expected"),
    [(False, ConsistencyLevel.SERIAL), (True, ConsistencyLevel.LOCAL_SERIAL)],
    ids=["default-SERIAL", "single-dc-LOCAL_SERIAL"],
)
async def test_the_configured_serial_consistency_is_the_drivers(
    scylla: ScyllaHarness, single_dc: bool, expected: int
) -> None:
    config = ServiceConfig(
        backend="scylla",
        scylla_contact_points=(scylla.host,),
        scylla_port=scylla.port,
        scylla_keyspace=scylla.keyspace,
        scylla_single_dc_conversations=single_dc,
    )
    backend = await open_backend(config)
    try:
        cluster = store_of(backend).cql._cluster
        profile = cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT]
        assert profile.serial_consistency_level == expected
    finally:
        await backend.close()
