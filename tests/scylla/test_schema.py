"""The backend fails closed on a missing, older or newer schema; migrations are idempotent."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from backends.scylla import open_scylla_backend
from backends.scylla.migrate import main as migrate_main
from backends.scylla.migrate import migrate
from backends.scylla.schema import (
    RECORD_VERSION,
    SCHEMA_SCOPE,
    SCHEMA_VERSION,
    SCHEMA_VERSION_TABLE,
    create_keyspace,
)
from backends.scylla.session import CqlSession
from service.domain.errors import StoreSchemaError
from service.domain.ports import Backend

pytestmark = pytest.mark.scylla


@pytest.fixture
async def admin(cql_contact: tuple[str, int]) -> AsyncIterator[CqlSession]:
    """A session on a fresh keyspace name (nothing created yet); dropped afterwards."""
    host, port = cql_contact
    keyspace = f"mcs_{uuid.uuid4().hex[:16]}"
    cql = await CqlSession.connect([host], port=port, keyspace=keyspace, requests=Counter())
    try:
        yield cql
    finally:
        await cql.simple("DROP KEYSPACE IF EXISTS {ks}", timeout_s=60)
        await cql.close()


async def _open(cql_contact: tuple[str, int], keyspace: str) -> Backend:
    host, port = cql_contact
    return await open_scylla_backend([host], port=port, keyspace=keyspace)


async def _version_table(cql: CqlSession, version: int) -> None:
    ddl = create_keyspace(cql.keyspace, {"class": "SimpleStrategy", "replication_factor": "1"},
                          tablets_off=False)  # fmt: skip
    await cql.simple(ddl, timeout_s=60, raw=True)
    await cql.simple(SCHEMA_VERSION_TABLE, timeout_s=60)
    await cql.simple(RECORD_VERSION, (SCHEMA_SCOPE, version, "test"))


async def test_an_unmigrated_keyspace_is_refused(
    cql_contact: tuple[str, int], admin: CqlSession
) -> None:
    with pytest.raises(StoreSchemaError, match="not migrated") as missing:
        await _open(cql_contact, admin.keyspace)
    ddl = create_keyspace(admin.keyspace, {"class": "SimpleStrategy", "replication_factor": "1"},
                          tablets_off=False)  # fmt: skip
    await admin.simple(ddl, timeout_s=60, raw=True)
    with pytest.raises(StoreSchemaError, match="not migrated"):
        await _open(cql_contact, admin.keyspace)  # a keyspace without tables is no better
    assert cql_contact[0] not in str(missing.value)


async def test_an_older_schema_is_refused(cql_contact: tuple[str, int], admin: CqlSession) -> None:
    await _version_table(admin, SCHEMA_VERSION - 1)
    with pytest.raises(StoreSchemaError, match="older"):
        await _open(cql_contact, admin.keyspace)


async def test_a_newer_schema_is_refused_by_open_readiness_and_migrate(
    cql_contact: tuple[str, int], admin: CqlSession
) -> None:
    host, port = cql_contact
    assert await migrate([host], port=port, keyspace=admin.keyspace) == SCHEMA_VERSION
    assert await migrate([host], port=port, keyspace=admin.keyspace) == SCHEMA_VERSION  # again
    backend = await _open(cql_contact, admin.keyspace)
    try:
        await backend.store.readiness()
        await backend.outbox.readiness()
        await admin.simple(RECORD_VERSION, (SCHEMA_SCOPE, SCHEMA_VERSION + 1, "from the future"))
        with pytest.raises(StoreSchemaError, match="newer"):
            await backend.store.readiness()
    finally:
        await backend.close()
    with pytest.raises(StoreSchemaError, match="newer"):
        await _open(cql_contact, admin.keyspace)
    args = ["--contact-points", host, "--port", str(port), "--keyspace", admin.keyspace]
    assert await asyncio.to_thread(migrate_main, args) == 2  # it runs its own loop
