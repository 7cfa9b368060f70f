"""The direct path is checked against the installed driver before it is used
(``backends/scylla/send_path.py``), with no server: the driver's messages are
built offline, from prepared statements made here with the column types of the
backend's schemas.
"""

from __future__ import annotations

import asyncio
import logging
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cassandra
import pytest
from cassandra import ConsistencyLevel, cqltypes
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ControlConnectionQueryFallback,
    Session,
)
from cassandra.policies import HostDistance
from cassandra.protocol import ColumnMetadata, ProtocolHandler
from cassandra.protocol_features import ProtocolFeatures
from cassandra.query import PreparedStatement
from prometheus_client import generate_latest

from backends.scylla import frames, send_path
from backends.scylla.direct import PROTOCOL_VERSION, Call, DirectSender
from backends.scylla.session import CqlSession, execution_profile
from service import config
from service.domain.errors import StoreMisconfigured
from service.metrics import ServiceMetrics

TEXT, BIGINT, INT = cqltypes.UTF8Type, cqltypes.LongType, cqltypes.Int32Type
TEXTS = cqltypes.ListType.apply_parameters([TEXT])
RETRIES = cqltypes.MapType.apply_parameters([cqltypes.TimeUUIDType, TEXT])
FENCES = cqltypes.MapType.apply_parameters([TEXT, BIGINT])
SCALARS = (
    TEXT,
    BIGINT,
    INT,
    cqltypes.BytesType,
    cqltypes.BooleanType,
    cqltypes.DateType,
    cqltypes.TimeUUIDType,
)
"""Every column type of backends/scylla/schema.py and delivery_schema.py."""


@dataclass
class Offline:
    cluster: Cluster
    session: Session
    cql: CqlSession

    @property
    def direct(self) -> DirectSender:
        assert self.cql.direct is not None
        return self.cql.direct


@pytest.fixture
async def offline() -> AsyncIterator[Offline]:
    """A cluster and session as CqlSession.connect makes them, never connected."""
    cl = ConsistencyLevel.LOCAL_QUORUM
    cluster = Cluster(
        ["127.0.0.1"],
        protocol_version=PROTOCOL_VERSION,
        execution_profiles={
            EXEC_PROFILE_DEFAULT: execution_profile(None, cl, ConsistencyLevel.SERIAL, 5.0)
        },
        compression=False,
        allow_control_connection_query_fallback=ControlConnectionQueryFallback.Fallback,
    )
    session = Session(cluster, [])
    session.default_fetch_size = None
    cql = CqlSession(cluster, session, "ks", Counter(), ConsistencyLevel.SERIAL, 5.0)
    try:
        yield Offline(cluster, session, cql)
    finally:
        await asyncio.to_thread(cluster.shutdown)


def _prepared(
    columns: list[Any],
    *,
    routing: tuple[int, ...] = (0,),
    lwt: bool = False,
    result: list[Any] | None = None,
    result_id: bytes | None = None,
    query_id: bytes = b"\x01\x02\x03\x04",
) -> PreparedStatement:
    meta = [ColumnMetadata("ks", "t", f"c{i}", t) for i, t in enumerate(columns)]
    rows = [ColumnMetadata("ks", "t", f"r{i}", t) for i, t in enumerate(result or [])]
    return PreparedStatement(
        meta, query_id, list(routing), "offline", "ks", PROTOCOL_VERSION, rows, result_id, lwt
    )


def shapes() -> Iterator[PreparedStatement]:
    """The shapes the backend prepares: plain and conditional writes over every
    column type, composite partition keys, reads with and without a metadata id."""
    for i, column in enumerate((*SCALARS, TEXTS, RETRIES, FENCES)):
        key = bytes([i + 1]) * 16
        yield _prepared([TEXT, TEXT, column], routing=(0, 1), query_id=key)
        yield _prepared([column, TEXT, TEXT, BIGINT], routing=(1, 2, 3), lwt=True, query_id=key)
    yield _prepared([TEXT], result=[cqltypes.BooleanType, BIGINT], query_id=b"lwt", lwt=True)
    yield _prepared([TEXT, TEXT], result=[TEXT, TEXTS], query_id=b"read")
    yield _prepared([TEXT, TEXT], result=[TEXT, TEXTS], result_id=b"id", query_id=b"read-id")


async def test_the_direct_frames_are_the_drivers_own_for_every_shape(offline: Offline) -> None:
    """Single, serial and batched, byte for byte. A read with cached metadata
    used to ask for rows without metadata where the driver does not (no metadata
    id on protocol v4), so its frame differed in the SKIP_METADATA flag."""
    statements = list(shapes())
    for prepared in statements:
        params = tuple(send_path.sample(c.type) for c in prepared.column_metadata)
        plan = offline.direct._plan(prepared)
        call = Call(((prepared, params),), consistency=ConsistencyLevel.SERIAL)
        ours = offline.direct._message(call, [(plan.encode(params), plan)])
        theirs = offline.session._create_response_future(
            call.statement(), None, False, None, None
        ).message
        ours.timestamp = theirs.timestamp = 1
        theirs.tablet_version_block = 0
        encode = offline.session.client_protocol_handler.encode_message
        assert encode(ours, 1, PROTOCOL_VERSION, None, False, None) == encode(
            theirs, 1, PROTOCOL_VERSION, None, False, None
        ), prepared.column_metadata
    assert send_path.check_frames(offline.direct, statements) == 3 * len(statements)


@pytest.mark.parametrize(
    "features",
    [
        None,
        ProtocolFeatures(),
        ProtocolFeatures(use_metadata_id=True),
        ProtocolFeatures(tablets_routing_v2=True),
        ProtocolFeatures(use_metadata_id=True, tablets_routing_v2=True, shard_id=3),
    ],
)
async def test_the_hand_packed_frames_are_the_drivers_own_on_every_feature_set(
    offline: Offline, features: ProtocolFeatures | None
) -> None:
    """``frames.encode`` packs EXECUTE and BATCH itself: Cassandra's layout and the
    two Scylla extensions (metadata id and SKIP_METADATA, the tablet byte), also
    through the driver's own encoder (a compressor would take that way)."""
    statements = list(shapes())
    assert send_path.check_frames(offline.direct, statements, [features]) == 3 * len(statements)
    prepared = statements[-1]  # a read with a metadata id
    params = tuple(send_path.sample(c.type) for c in prepared.column_metadata)
    plan = offline.direct._plan(prepared)
    ours = offline.direct._message(Call(((prepared, params),)), [(plan.encode(params), plan)])
    driver = offline.session.client_protocol_handler.encode_message
    assert frames.encode(ours, 7, PROTOCOL_VERSION, None, False, features) == driver(
        ours, 7, PROTOCOL_VERSION, None, False, features
    )


async def test_a_frame_that_differs_turns_the_direct_path_off_once(
    offline: Offline, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = DirectSender._message

    def one_level_off(self: DirectSender, call: Call, encoded: Any) -> Any:
        message = original(self, call, encoded)
        message.consistency_level = ConsistencyLevel.ONE
        return message

    monkeypatch.setattr(DirectSender, "_message", one_level_off)
    with caplog.at_level(logging.WARNING, logger="backends.scylla.session"):
        offline.cql._check_frames(list(shapes()))
        offline.cql._check_frames(list(shapes()))  # a second prepare: no second warning
    assert offline.cql.direct is None
    assert offline.cql.events == {"direct_path_refused": 1}
    (record,) = caplog.records
    assert "frame differs" in record.getMessage() and "offline" not in record.getMessage()


@pytest.mark.parametrize("version", ["3.29.13", "3.30.0", "4.0.0"])
async def test_a_driver_it_was_not_built_for_gets_the_driver_path_or_a_refusal(
    offline: Offline,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    version: str,
) -> None:
    monkeypatch.setattr(cassandra, "__version__", version)
    with caplog.at_level(logging.WARNING, logger="backends.scylla.session"):
        offline.cql.check_driver()
    assert offline.cql.direct is None and offline.cql.events["direct_path_refused"] == 1
    assert version in caplog.text
    strict = CqlSession(
        offline.cluster, offline.session, "ks", Counter(), 0, 5.0, send_path="direct"
    )
    with pytest.raises(StoreMisconfigured, match="does not match the installed driver"):
        strict.check_driver()


async def test_a_changed_driver_signature_turns_the_direct_path_off(
    offline: Offline, monkeypatch: pytest.MonkeyPatch
) -> None:
    def older(msg: Any, stream_id: int, protocol_version: int, compressor: Any) -> bytes:
        raise AssertionError("never called")

    # frames.encode falls back on it (and mirrors its parameters, send_msg's keywords)
    monkeypatch.setattr(ProtocolHandler, "encode_message", older)
    offline.cql.check_driver()
    assert offline.cql.direct is None and offline.cql.events["direct_path_refused"] == 1


async def test_the_installed_driver_passes_every_check(offline: Offline) -> None:
    offline.cql.check_driver()
    offline.cql._check_frames(list(shapes()))
    assert offline.cql.direct is not None and not offline.cql.events


async def test_the_driver_path_never_builds_a_direct_sender(offline: Offline) -> None:
    cql = CqlSession(offline.cluster, offline.session, "ks", Counter(), 0, 5.0, send_path="driver")
    assert cql.direct is None


def test_the_send_path_is_a_setting() -> None:
    assert config.load({"backend": "memory"}, {}).scylla_send_path == "auto"
    loaded = config.load({"backend": "memory"}, {"MC_SCYLLA_SEND_PATH": "driver"})
    assert loaded.scylla_send_path == "driver"
    with pytest.raises(config.ConfigError, match="MC_SCYLLA_SEND_PATH"):
        config.load({"backend": "memory"}, {"MC_SCYLLA_SEND_PATH": "fast"})
    assert config.SCYLLA_SEND_PATHS == send_path.SEND_PATHS


def test_the_driver_is_pinned_to_the_release_the_path_was_built_for() -> None:
    """pyproject.toml allowed any 3.x; the lock alone pinned the release."""
    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    drivers = [d for d in pyproject["project"]["dependencies"] if d.startswith("scylla-driver")]
    assert drivers == [f"scylla-driver=={send_path.BUILT_FOR}"]
    assert f"scylla-driver=={send_path.BUILT_FOR}" in (root / "requirements.lock").read_text()


class _Host:
    is_up = True


class _Local:
    @staticmethod
    def distance(host: object) -> int:
        return int(HostDistance.LOCAL)


async def test_conditional_writes_keep_ring_order_on_cassandra_too(
    offline: Offline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cassandra never sets the LWT flag at PREPARE, so the statement alone did not
    make a conditional write ordered: it went round the replicas like a plain one
    (docs/scylla.md said ring order)."""
    prepared = _prepared([TEXT, TEXT, BIGINT], routing=(0, 1))  # as Cassandra prepares it
    assert not prepared.is_lwt()
    offline.cql._prepared["bump"] = prepared
    sent: list[Call] = []

    async def capture(name: str, call: Call, mode: str) -> list[dict[str, object]]:
        sent.append(call)
        return [{"[applied]": True}]

    monkeypatch.setattr(offline.cql, "_run", capture)
    await offline.cql.cas("bump", ("a", "b", 1))
    await offline.cql.cas_batch([("bump", ("a", "b", 1)), ("bump", ("a", "b", 2))])
    await offline.cql.write("bump", ("a", "b", 1))
    assert [call.ordered() for call in sent] == [True, True, False]
    replicas = [_Host(), _Host(), _Host()]
    monkeypatch.setattr(offline.direct, "_policy", _Local())
    assert {id(offline.direct._coordinator(replicas, True)) for _ in range(6)} == {id(replicas[0])}
    assert len({id(offline.direct._coordinator(replicas, False)) for _ in range(6)}) == 3


def test_a_refused_direct_path_is_a_metric() -> None:
    metrics = ServiceMetrics()
    events: Counter[str] = Counter()
    metrics.describe_backend("scylla", True, Counter(), events)
    events["direct_path_refused"] += 1  # read at scrape time
    text = generate_latest(metrics.registry).decode()
    assert 'message_committer_backend_events_total{kind="direct_path_refused"} 1.0' in text
