"""Which send path a session takes: the direct one only where it is proven to be the driver's.

``direct.py`` builds frames with private parts of scylla-driver (``Session._pools``,
``Connection._requests``, ``ProtocolHandler.encode_message``'s parameters, ...). Those parts are not
an API: any release may change them. So the direct path is used only when

* the installed driver is the release it was built for (``BUILT_FOR``, pinned in
  pyproject.toml as well);
* every part it touches is there, with the parameters it passes
  (``check_parts``);
* for every prepared statement the service uses, the frame the direct path
  encodes is byte-equal to the one the driver itself encodes for the same
  request, for a single EXECUTE, a serial one and an unlogged BATCH, on each
  protocol feature set in use (``check_frames``). The routing key is compared
  too. Two fields are per request by nature and are compared for presence
  only, then set equal: the client timestamp, and the tablet version block
  (random in the driver's frames for a table without tablets; the backend
  refuses keyspaces with tablets, ``tablets.py``).

``MC_SCYLLA_SEND_PATH`` decides what a failed check does: ``auto`` (default) logs
one warning, counts ``direct_path_refused`` in the backend's events and sends
everything through the driver's ``execute_async``; ``direct`` refuses to start
(``StoreMisconfigured``); ``driver`` never uses the direct path. These checks need
no server: ``tests/scylla/test_send_path.py`` runs them on messages built offline.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import cassandra
from cassandra import ConsistencyLevel, cqltypes
from cassandra.cluster import Session
from cassandra.connection import Connection, DefaultEndPoint
from cassandra.pool import HostConnection
from cassandra.protocol import ExecuteMessage, ProtocolHandler
from cassandra.query import PreparedStatement

from backends.scylla.direct import PROTOCOL_VERSION, Call, DirectSender
from backends.scylla.frames import encode as encode_frame

BUILT_FOR = "3.29.12"
"""The scylla-driver release direct.py was written against and checked with."""

SendPath = Literal["auto", "driver", "direct"]
SEND_PATHS: tuple[SendPath, ...] = ("auto", "driver", "direct")
_STREAM = 1
_TIMESTAMP = 1_700_000_000_000_000

_SIGNATURES: tuple[tuple[Any, str, tuple[str, ...]], ...] = (
    (
        HostConnection,
        "borrow_connection",
        ("self", "timeout", "routing_key", "keyspace", "table", "routing_token"),
    ),
    (HostConnection, "return_connection", ("self", "connection", "stream_was_orphaned")),
    (
        Connection,
        "send_msg",
        ("self", "msg", "request_id", "cb", "encoder", "decoder", "result_metadata"),
    ),
    (Connection, "defunct", ("self", "exc")),
    (
        ProtocolHandler,
        "encode_message",
        (
            "msg",
            "stream_id",
            "protocol_version",
            "compressor",
            "allow_beta_protocol_version",
            "protocol_features",
        ),
    ),
    (
        PreparedStatement,
        "update_result_metadata",
        ("self", "result_metadata", "result_metadata_id"),
    ),
    (
        Session,
        "_create_response_future",
        ("self", "query", "parameters", "trace", "custom_payload", "timeout"),
    ),
)
_CONNECTION_FIELDS = (
    "_requests",
    "request_ids",
    "orphaned_request_ids",
    "orphaned_threshold",
    "orphaned_threshold_reached",
    "lock",
    "in_flight",
    "max_request_id",
    "is_closed",
    "is_defunct",
    "features",
)
_SESSION_FIELDS = ("_pools", "client_protocol_handler", "use_client_timestamp", "cluster")


class PathMismatch(Exception):
    """The direct path does not match the installed driver; the text says where
    (no host, no value, no CQL)."""


def check_version() -> None:
    version = cassandra.__version__
    if version != BUILT_FOR:
        raise PathMismatch(f"scylla-driver {version} is not {BUILT_FOR}, which it was built for")


def check_parts(session: Session) -> None:
    """Every driver part direct.py touches exists, with the parameters it passes."""
    for owner, attribute, expected in _SIGNATURES:
        where = f"{owner.__name__}.{attribute}"
        try:
            names = tuple(inspect.signature(getattr(owner, attribute)).parameters)
        except (AttributeError, TypeError, ValueError):
            raise PathMismatch(f"{where} is missing or has no signature") from None
        if names[: len(expected)] != expected:
            raise PathMismatch(f"{where} takes {names}, not {expected}")
    probe = Connection(DefaultEndPoint("127.0.0.1", 9), protocol_version=PROTOCOL_VERSION)
    missing = [name for name in _CONNECTION_FIELDS if not hasattr(probe, name)]
    missing += [f"Session.{name}" for name in _SESSION_FIELDS if not hasattr(session, name)]
    if missing:
        raise PathMismatch(f"the driver has no {', '.join(missing)}")


def check_frames(
    sender: DirectSender,
    statements: Iterable[PreparedStatement],
    features: Sequence[Any | None] = (None,),
) -> int:
    """Encode each statement's single, serial and batched request both ways and
    compare the bytes; returns how many frames were compared."""
    session = sender.session
    handler = session.client_protocol_handler
    compared = 0
    for prepared in statements:
        params = tuple(sample(column.type) for column in prepared.column_metadata or ())
        plan = sender._plan(prepared)
        values = plan.encode(params)
        bound = prepared.bind(params)
        if plan.routing_key(values) != bound.routing_key:
            raise PathMismatch(f"routing key differs for {_shape(prepared)}")
        serial = ConsistencyLevel.SERIAL
        for call in (
            Call(((prepared, params),)),
            Call(((prepared, params),), consistency=serial, idempotent=True),
            Call(((prepared, params), (prepared, params)), batch=True),
        ):
            ours = sender._message(call, [(values, plan)] * len(call.items))
            theirs = session._create_response_future(
                call.statement(), None, False, None, None
            ).message
            _align(ours, theirs)
            for feature_set in features:
                mine = encode_frame(ours, _STREAM, PROTOCOL_VERSION, None, False, feature_set)
                driver = handler.encode_message(
                    theirs, _STREAM, PROTOCOL_VERSION, None, False, feature_set
                )
                if mine != driver:
                    kind = "batch" if call.batch else "execute"
                    raise PathMismatch(f"the {kind} frame differs for {_shape(prepared)}")
                compared += 1
    return compared


def _align(ours: Any, theirs: Any) -> None:
    """The per-request fields: the same presence, then the same value."""
    if (ours.timestamp is None) != (theirs.timestamp is None):
        raise PathMismatch("the client timestamp is set on one path only")
    if ours.timestamp is not None:
        ours.timestamp = theirs.timestamp = _TIMESTAMP
    if isinstance(theirs, ExecuteMessage):
        theirs.tablet_version_block = ours.tablet_version_block


def _shape(prepared: PreparedStatement) -> str:
    """A statement's shape, for a log line: its column types, never its CQL."""
    types = ",".join(c.type.cql_parameterized_type() for c in prepared.column_metadata or ())
    return f"({types}){' lwt' if prepared.is_lwt() else ''}"


def sample(cqltype: Any) -> object:
    """A value of ``cqltype`` (the column types the schemas use, and a few more)."""
    if issubclass(cqltype, cqltypes.MapType):
        key, value = cqltype.subtypes
        return {sample(key): sample(value)}
    if issubclass(cqltype, cqltypes.SetType):
        return {sample(cqltype.subtypes[0])}
    if issubclass(cqltype, cqltypes.ListType):
        return [sample(cqltype.subtypes[0]), sample(cqltype.subtypes[0])]
    if issubclass(cqltype, cqltypes.TupleType):
        return tuple(sample(sub) for sub in cqltype.subtypes)
    scalars: dict[str, object] = {
        "text": "sample é",
        "varchar": "sample",
        "ascii": "sample",
        "bigint": -(2**40),
        "counter": 3,
        "int": 70_000,
        "smallint": 7,
        "tinyint": 7,
        "blob": b"\x00\xff",
        "boolean": True,
        "timestamp": 1_700_000_000_000,
        "uuid": uuid.UUID(int=0x1234),
        "timeuuid": uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
        "double": 0.5,
        "float": 0.5,
    }
    try:
        return scalars[cqltype.typename]
    except KeyError:
        raise PathMismatch(f"no sample for the column type {cqltype.typename}") from None
