"""Pure functions of the Scylla backend (no server needed)."""

from __future__ import annotations

import pytest
from cassandra import (
    ConsistencyLevel,
    DriverException,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.protocol import OverloadedErrorMessage

from backends.scylla.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    check_keyspace,
    create_keyspace,
    parse_replication,
)
from backends.scylla.session import DRIVER_ERRORS, _translate, consistency_level
from service.domain.errors import StoreInvalid, StoreOutcomeUnknown, StoreUnavailable


def test_replication_forms() -> None:
    assert parse_replication("SimpleStrategy:1") == {
        "class": "SimpleStrategy",
        "replication_factor": "1",
    }
    assert parse_replication("NetworkTopologyStrategy:dc1=3, dc2=2") == {
        "class": "NetworkTopologyStrategy",
        "dc1": "3",
        "dc2": "2",
    }
    assert parse_replication({"class": "SimpleStrategy", "replication_factor": 3}) == {
        "class": "SimpleStrategy",
        "replication_factor": "3",
    }
    for bad in ("", "Local:1", "SimpleStrategy:", "SimpleStrategy:x", "NetworkTopologyStrategy:dc1",
                "NetworkTopologyStrategy:dc'1=3"):  # fmt: skip
        with pytest.raises(StoreInvalid):
            parse_replication(bad)


def test_keyspace_ddl_adds_tablets_off_only_when_asked() -> None:
    rep = parse_replication("SimpleStrategy:1")
    plain = create_keyspace("mc", rep, tablets_off=False)
    assert "tablets" not in plain and "'replication_factor': '1'" in plain
    assert create_keyspace("mc", rep, tablets_off=True).endswith("AND tablets = {'enabled': false}")
    for bad in ("", "1abc", "a-b", "x" * 49, 'a"; DROP'):
        with pytest.raises(StoreInvalid):
            check_keyspace(bad)


def test_migrations_are_ordered_and_idempotent_statements() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    for migration in MIGRATIONS:
        assert all("IF NOT EXISTS" in s for s in migration.statements)


def test_consistency_names() -> None:
    assert consistency_level("local_quorum", ("LOCAL_QUORUM",)) == ConsistencyLevel.LOCAL_QUORUM
    with pytest.raises(StoreInvalid):
        consistency_level("SERIAL", ("LOCAL_QUORUM",))


def test_driver_errors_map_by_what_is_known_about_the_write() -> None:
    timeout = WriteTimeout("t", write_type=1)
    assert type(_translate(timeout, "cas")) is StoreOutcomeUnknown
    assert type(_translate(timeout, "write")) is StoreOutcomeUnknown
    assert type(_translate(ReadTimeout("t"), "read")) is StoreUnavailable
    assert type(_translate(ReadTimeout("t"), "serial")) is StoreOutcomeUnknown
    assert type(_translate(OperationTimedOut("t"), "read")) is StoreUnavailable
    assert type(_translate(Unavailable("t"), "cas")) is StoreOutcomeUnknown
    assert type(_translate(Unavailable("t"), "write")) is StoreUnavailable
    assert "127.0.0.1" not in str(_translate(OperationTimedOut("x", "127.0.0.1:9042"), "read"))
    overloaded = OverloadedErrorMessage(0x1001, "overloaded at 127.0.0.1", None)
    assert isinstance(overloaded, DRIVER_ERRORS) and not isinstance(overloaded, DriverException)
    assert type(_translate(overloaded, "read")) is StoreUnavailable
    assert type(_translate(overloaded, "write")) is StoreUnavailable
    assert type(_translate(overloaded, "cas")) is StoreOutcomeUnknown
    assert "127.0.0.1" not in str(_translate(overloaded, "cas"))
