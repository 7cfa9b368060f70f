"""Wiring: ``open_scylla_backend`` connects, checks the schema, prepares, builds the ports."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from backends.scylla import (
    abandon,
    commits,
    history,
    members,
    outbox,
    recovery,
    recovery_queue,
    sequence,
    skew,
    store,
)
from backends.scylla.delivery import open_delivery
from backends.scylla.history import TTL_SLACK_S, History, ttl_s
from backends.scylla.members import ScyllaMembershipStore
from backends.scylla.outbox_log import PartitionedOutbox
from backends.scylla.recovery import RecoveryIndex
from backends.scylla.schema import (
    HAS_TABLETS,
    READ_VERSION,
    SCHEMA_SCOPE,
    SCHEMA_VERSION,
    check_keyspace,
)
from backends.scylla.send_path import SEND_PATHS
from backends.scylla.sequence import SeqAllocator
from backends.scylla.session import CqlSession, NodeRoutes
from backends.scylla.store import ScyllaMessageStore
from backends.scylla.tls import ClusterTls
from service.domain.delivery import DeliverySettings
from service.domain.errors import StoreInvalid, StoreSchemaError
from service.domain.ports import Backend, Clock, StoreSettings, SystemClock

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._~:\-]{0,128}")
_READINESS = {"schema.version": READ_VERSION.replace("%s", "?")}
KEYSPACE_TABLETS = (
    "SELECT initial_tablets FROM system_schema.scylla_keyspaces WHERE keyspace_name = %s"
)


async def require_no_tablets(cql: CqlSession) -> None:
    """Refuse a keyspace that uses tablets (ScyllaDB 6+): requests are routed by
    the vnode token map and sent with no tablet version (``direct.py``), and
    ScyllaDB runs no LWTs there anyway. ``migrate`` creates keyspaces without
    tablets; this catches one an operator made. Cassandra has no tablets."""
    if not await cql.simple(HAS_TABLETS):
        return
    rows = await cql.simple(KEYSPACE_TABLETS, (cql.keyspace,), raw=True)
    if rows and rows[0].get("initial_tablets") is not None:
        raise StoreSchemaError(
            "scylla: the keyspace uses tablets, which this release cannot route and"
            " whose conditional writes ScyllaDB does not support; create it with"
            " `message-committer migrate` (tablets off) and move the data there"
        )


async def schema_version(cql: CqlSession) -> int | None:
    """The applied schema version, or None when the keyspace is not migrated."""
    try:
        rows = await cql.simple(READ_VERSION, (SCHEMA_SCOPE,))
    except StoreSchemaError:  # no keyspace or no schema_version table
        return None
    return int(rows[0]["version"]) if rows else None


def require_version(found: int | None) -> None:
    """Fail closed unless ``found`` is exactly the version this release runs on."""
    if found is None:
        raise StoreSchemaError(
            "scylla: the keyspace is not migrated; run `message-committer migrate` first"
        )
    if found < SCHEMA_VERSION:
        raise StoreSchemaError(
            f"scylla: schema version {found} is older than {SCHEMA_VERSION};"
            " run `message-committer migrate` first"
        )
    if found > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"scylla: schema version {found} is newer than this release supports"
            f" ({SCHEMA_VERSION}); upgrade the service"
        )


async def open_scylla_backend(
    contact_points: Sequence[str],
    *,
    port: int = 9042,
    keyspace: str = "message_committer",
    settings: StoreSettings | None = None,
    clock: Clock | None = None,
    identity_form: Literal["digest", "whole"] = "digest",
    username: str | None = None,
    password: str | None = None,
    local_dc: str | None = None,
    consistency: str = "LOCAL_QUORUM",
    serial_consistency: str = "SERIAL",
    request_timeout_s: float = 5.0,
    namespace: str = "",
    max_clock_skew_ms: int | None = 3000,
    node_routes: NodeRoutes | None = None,
    delivery: DeliverySettings | None = None,
    send_path: str = "auto",
    tls: ClusterTls | None = None,
) -> Backend:
    """The Scylla backend (name "scylla", durable).

    Fails closed: StoreUnavailable when the cluster cannot be reached (the
    text names no host and no credential), StoreSchemaError when the
    keyspace is not migrated to exactly ``SCHEMA_VERSION``.

    ``namespace`` scopes the two structures that are not tenant-scoped, the
    recovery index and the outbox log, so that several deployments (or test
    cases) can share a keyspace. Every replica of one deployment must use the
    same value; the default "" suits one deployment per keyspace.

    ``max_clock_skew_ms``: the replica's clock (``clock``) decides expiry, so
    open and every readiness probe measure it against the cluster's and refuse
    (StoreMisconfigured) beyond this bound; None skips the check (tests that
    drive time with a manual clock far from the wall clock).

    ``node_routes`` (``{node address: (host, port)}``) dials each mapped node
    through its route, e.g. a fault-injection proxy (see ``session``).

    ``send_path`` (auto, driver, direct): whether prepared statements take the
    direct path, which is checked against the installed driver first (``send_path``).

    ``tls``: TLS to the cluster, each node's certificate checked (``tls``).
    """
    check_keyspace(keyspace)
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise StoreInvalid("namespace must be up to 128 characters from A-Z a-z 0-9 . _ ~ : -")
    settings = (settings or StoreSettings()).validate()
    clock = clock or SystemClock()
    if send_path not in SEND_PATHS:
        raise StoreInvalid("send_path must be one of " + ", ".join(SEND_PATHS))
    requests: Counter[str] = Counter()
    events: Counter[str] = Counter()
    cql = await CqlSession.connect(
        contact_points,
        port=port,
        keyspace=keyspace,
        requests=requests,
        username=username,
        password=password,
        local_dc=local_dc,
        consistency=consistency,
        serial_consistency=serial_consistency,
        request_timeout_s=request_timeout_s,
        node_routes=node_routes,
        send_path=send_path,
        events=events,
        tls=tls,
    )
    last_offset = skew.LastOffset()
    try:
        require_version(await schema_version(cql))
        await require_no_tablets(cql)
        await cql.prepare(
            {
                **_READINESS,
                **skew.STATEMENTS,
                **commits.STATEMENTS,
                **recovery_queue.STATEMENTS,
                **members.STATEMENTS,
                **sequence.STATEMENTS,
                **history.STATEMENTS,
                **recovery.STATEMENTS,
                **outbox.STATEMENTS,
                **store.STATEMENTS,
                **abandon.STATEMENTS,
            }
        )
        await skew.check(cql, clock, max_clock_skew_ms, skew.SAMPLES_AT_OPEN, last_offset)
        ports = await open_delivery(cql, namespace, clock, delivery or DeliverySettings())
    except BaseException:
        await cql.close()
        raise

    async def readiness() -> None:
        rows = await cql.read("schema.version", (SCHEMA_SCOPE,))
        require_version(int(rows[0]["version"]) if rows else None)
        await skew.check(cql, clock, max_clock_skew_ms, skew.SAMPLES_AT_READINESS, last_offset)

    async def clock_guard() -> None:
        await skew.check(cql, clock, max_clock_skew_ms, skew.SAMPLES_AT_READINESS, last_offset)

    commit_ttl_s = ttl_s(settings.idempotency_window_ms, TTL_SLACK_S)
    # A seq reservation must never outlive a committed intent (see sequence).
    seqs = SeqAllocator(cql, reservation_ttl_s=commit_ttl_s)
    membership = ScyllaMembershipStore(cql, clock, seen=seqs.observe)
    message_store = ScyllaMessageStore(
        cql,
        seqs,
        History(cql, membership, clock, settings.history_retention_ms),
        RecoveryIndex(cql, namespace, clock),
        settings,
        clock,
        identity_form,
        readiness,
        commit_ttl_s,
        clock_guard,
    )
    return Backend(
        name="scylla",
        store=message_store,
        membership=membership,
        # Schema 3: commits publish to the partitioned outbox the relays lease
        # (backends.scylla.outbox_log, .relay); the old table is drained as its legacy partition.
        outbox=PartitionedOutbox(cql, namespace, readiness),
        durable=True,
        closers=[cql.close],
        requests=requests,
        events=events,
        delivery=ports,
        clock_offset_ms=last_offset,
    )
