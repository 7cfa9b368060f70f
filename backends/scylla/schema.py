"""The CQL schema, as versioned, idempotent migrations.

``migrate`` (``backends/scylla/migrate.py``) applies every migration newer
than the version recorded in ``schema_version``; ``open_scylla_backend``
refuses a keyspace whose recorded version is missing, older or newer than
``SCHEMA_VERSION``. Every table is created ``IF NOT EXISTS`` and every added
column is added only when ``system_schema.columns`` does not list it yet
(ScyllaDB has no ``ADD IF NOT EXISTS``), so re-running a migration that
stopped half-way is safe. Run migrations from one place (a deploy job), not
from every replica: concurrent schema changes of the same table can disagree
on a CQL cluster.

Tables (all partition keys are composite keys, so tenant-scoped ids are
encoded by the protocol and can never collide, whatever they contain):

==================  ==============================  ==============================================
table               partition / clustering          access path
==================  ==============================  ==============================================
commits             (tenant, sender, cmid)          one intent per CommitKey, with its recovery
                                                    bookkeeping (rq_*); compacted (and TTLed by
                                                    the idempotency window) at COMMITTED; an
                                                    abandoned intent's tombstone likewise
conversations       (tenant, conversation) /        static: membership version, lowest readable
                    kind, name, cmid                version, member count, last allocated seq;
                                                    rows: members with their version intervals
                                                    (kind 'm'), a sentinel (kind 'n'),
                                                    short-lived seq reservations (kind 'r')
                                                    and abandoned seqs (kind 'g', TTL the
                                                    history retention)
history             (tenant, conversation, bucket)  records, bucket = seq // 1000, by seq, each
                    / seq                           with the membership version its commit froze
                                                    (schema 5; older rows: null, unknown)
history_expiry      (tenant, conversation) /        when each committed seq leaves history, plus
                    expires_at_ms DESC, seq DESC    static registers; gives available_from_seq
history_pins        (tenant, conversation, bucket)  seqs retention must not pass: unfinished
                    / seq                           intents, late commits until their own expiry
recovery_index      (namespace, minute, shard) /    the recovery queue: unfinished intents by due
                    created_at_ms (= due), key      time (the column keeps its release-1 name)
recovery_created    (namespace, minute, shard) /    unfinished intents by creation time (stats)
                    created_at_ms, key
recovery_buckets    (namespace) / minute            minutes that may still hold entries of either
                                                    (partition "ns:<ns>": queue, "created:<ns>")
recovery_quarantine (namespace) / key               quarantined intents
outbox              (namespace, day) / position     the outbox log, position = timeuuid (schema 3
                                                   on: drained as the relay's legacy partition)
outbox_days         (namespace) / day               days that hold outbox entries
schema_version      (scope) / version DESC          applied migrations
==================  ==============================  ==============================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from backends.scylla import delivery_schema
from service.domain.errors import StoreInvalid

SCHEMA_SCOPE = "message_committer"
SCHEMA_VERSION = 6
HISTORY_BUCKET = 1000
"""Sequence numbers per history partition: bounded partitions, few reads per page."""

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_REPLICATION_VALUE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

_RECORD_COLUMNS = """
    device text, message_type text, custom_type text, body blob,
    body_ref_uri text, body_ref_size bigint, body_ref_sha256 text,
    mentions frozen<list<text>>, reply_to text"""


@dataclass(frozen=True, slots=True)
class Column:
    """A column a migration adds to an existing table (when it is not there yet)."""

    table: str
    name: str
    cql_type: str
    static: bool = False

    def ddl(self) -> str:
        static = " static" if self.static else ""
        return f"ALTER TABLE {{ks}}.{self.table} ADD {self.name} {self.cql_type}{static}"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    columns: tuple[Column, ...] = ()
    """Added after ``statements``; see ``migrate`` for the data a migration converts."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "commit intents, conversations, history, recovery index, outbox",
        (
            f"""CREATE TABLE IF NOT EXISTS {{ks}}.commits (
    tenant text, sender text, cmid text,
    conversation text, identity blob, state text,
    seq bigint, message_id text, server_ts_ms bigint, created_at_ms bigint,{_RECORD_COLUMNS},
    recipients frozen<list<text>>, membership_version bigint,
    pub_stream text, pub_position text, expires_at_ms bigint,
    PRIMARY KEY ((tenant, sender, cmid))
) WITH comment = 'one commit intent per CommitKey'""",
            """CREATE TABLE IF NOT EXISTS {ks}.conversations (
    tenant text, conversation text, kind text, name text, cmid text,
    version bigint static, last_seq bigint static, created_at_ms bigint static,
    seq bigint,
    PRIMARY KEY ((tenant, conversation), kind, name, cmid)
) WITH comment = 'membership and sequence allocation'""",
            f"""CREATE TABLE IF NOT EXISTS {{ks}}.history (
    tenant text, conversation text, bucket bigint, seq bigint,
    message_id text, sender text, cmid text,{_RECORD_COLUMNS},
    server_ts_ms bigint, expires_at_ms bigint,
    PRIMARY KEY ((tenant, conversation, bucket), seq)
) WITH comment = 'conversation history'""",
            """CREATE TABLE IF NOT EXISTS {ks}.history_expiry (
    tenant text, conversation text, expires_at_ms bigint, seq bigint,
    max_committed_seq bigint static, last_commit_ms bigint static,
    PRIMARY KEY ((tenant, conversation), expires_at_ms, seq)
) WITH CLUSTERING ORDER BY (expires_at_ms DESC, seq DESC)
  AND comment = 'history retention schedule'""",
            """CREATE TABLE IF NOT EXISTS {ks}.recovery_index (
    namespace text, bucket bigint, shard int,
    created_at_ms bigint, tenant text, sender text, cmid text,
    PRIMARY KEY ((namespace, bucket, shard), created_at_ms, tenant, sender, cmid)
) WITH gc_grace_seconds = 3600 AND comment = 'unfinished intents by creation minute'""",
            """CREATE TABLE IF NOT EXISTS {ks}.recovery_buckets (
    namespace text, bucket bigint,
    PRIMARY KEY ((namespace), bucket)
) WITH gc_grace_seconds = 3600 AND comment = 'minutes that may hold unfinished intents'""",
            """CREATE TABLE IF NOT EXISTS {ks}.outbox (
    namespace text, day bigint, position timeuuid,
    tenant text, conversation text, seq bigint, message_id text,
    recipients frozen<list<text>>,
    PRIMARY KEY ((namespace, day), position)
) WITH comment = 'outbox log'""",
            """CREATE TABLE IF NOT EXISTS {ks}.outbox_days (
    namespace text, day bigint,
    PRIMARY KEY ((namespace), day)
) WITH comment = 'days of the outbox log'""",
        ),
    ),
    Migration(
        2,
        "versioned membership, recovery queue with attempts and quarantine, retention pins,"
        " outbox by reference",
        (
            """CREATE TABLE IF NOT EXISTS {ks}.history_pins (
    tenant text, conversation text, bucket bigint, seq bigint, until_ms bigint,
    PRIMARY KEY ((tenant, conversation, bucket), seq)
) WITH gc_grace_seconds = 86400 AND comment = 'seqs history retention must not pass'""",
            """CREATE TABLE IF NOT EXISTS {ks}.recovery_created (
    namespace text, bucket bigint, shard int,
    created_at_ms bigint, tenant text, sender text, cmid text,
    PRIMARY KEY ((namespace, bucket, shard), created_at_ms, tenant, sender, cmid)
) WITH gc_grace_seconds = 3600 AND comment = 'unfinished intents by creation minute'""",
            """CREATE TABLE IF NOT EXISTS {ks}.recovery_quarantine (
    namespace text, tenant text, sender text, cmid text,
    created_at_ms bigint, conversation text,
    PRIMARY KEY ((namespace), tenant, sender, cmid)
) WITH comment = 'quarantined intents'""",
        ),
        (
            Column("conversations", "intervals", "text"),
            Column("conversations", "member_count", "bigint", static=True),
            Column("conversations", "floor_version", "bigint", static=True),
            Column("commits", "rq_attempts", "int"),
            Column("commits", "rq_due_ms", "bigint"),
            Column("commits", "rq_problem", "text"),
            Column("commits", "rq_quarantined", "boolean"),
            Column("history_expiry", "floor_seq", "bigint", static=True),
            Column("recovery_index", "conversation", "text"),
            Column("recovery_index", "seq", "bigint"),
            Column("recovery_index", "message_id", "text"),
            Column("recovery_index", "created_ms", "bigint"),
            Column("outbox", "membership_version", "bigint"),
        ),
    ),
    Migration(3, delivery_schema.DESCRIPTION, delivery_schema.TABLES),
    Migration(
        4,
        "mailbox entries carry their membership version",
        (),
        (Column("mailboxes", "membership_version", "bigint"),),
    ),
    Migration(
        5,
        "history records carry their membership version",
        (),
        (Column("history", "membership_version", "bigint"),),
    ),
    Migration(6, "the conversations a user left, by time", (delivery_schema.LEFT_TABLE,)),
)
assert MIGRATIONS[-1].version == SCHEMA_VERSION

SCHEMA_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS {ks}.schema_version (
    scope text, version int, description text, applied_at timestamp,
    PRIMARY KEY ((scope), version)
) WITH CLUSTERING ORDER BY (version DESC) AND comment = 'applied schema migrations'"""
READ_VERSION = "SELECT version FROM {ks}.schema_version WHERE scope = %s LIMIT 1"
RECORD_VERSION = (
    "INSERT INTO {ks}.schema_version (scope, version, description, applied_at)"
    " VALUES (%s, %s, %s, toTimestamp(now()))"
)

# A ScyllaDB that knows tablets has this column; Cassandra has no scylla_* tables at all.
COLUMNS_OF = "SELECT table_name, column_name FROM system_schema.columns WHERE keyspace_name = %s"

HAS_TABLETS = (
    "SELECT column_name FROM system_schema.columns WHERE keyspace_name = 'system_schema'"
    " AND table_name = 'scylla_keyspaces' AND column_name = 'initial_tablets'"
)


def check_keyspace(name: str) -> str:
    """``name`` if it is a plain CQL identifier (it is spliced into CQL), else raise."""
    if not _NAME_RE.fullmatch(name):
        raise StoreInvalid("keyspace must be 1-48 characters from A-Z a-z 0-9 _, starting a letter")
    return name


def parse_replication(value: str | Mapping[str, object]) -> dict[str, str]:
    """A replication map from ``"SimpleStrategy:1"``,
    ``"NetworkTopologyStrategy:dc1=3,dc2=2"`` or a ready dict."""
    if isinstance(value, Mapping):
        result = {str(k): str(v) for k, v in value.items()}
    else:
        strategy, _, rest = value.partition(":")
        strategy = strategy.strip()
        if strategy == "SimpleStrategy":
            result = {"class": strategy, "replication_factor": rest.strip()}
        elif strategy == "NetworkTopologyStrategy":
            result = {"class": strategy}
            for part in filter(None, (p.strip() for p in rest.split(","))):
                dc, eq, factor = part.partition("=")
                if not eq:
                    raise StoreInvalid("NetworkTopologyStrategy needs dc=factor pairs")
                result[dc.strip()] = factor.strip()
        else:
            raise StoreInvalid(
                "replication must be SimpleStrategy:N or NetworkTopologyStrategy:dc=N"
            )
    if result.get("class") not in ("SimpleStrategy", "NetworkTopologyStrategy") or len(result) < 2:
        raise StoreInvalid("replication needs a class and at least one replication factor")
    for key, item in result.items():
        if not (_REPLICATION_VALUE_RE.fullmatch(key) and _REPLICATION_VALUE_RE.fullmatch(item)):
            raise StoreInvalid("replication keys and values must be plain names and numbers")
        if key != "class" and not item.isdigit():
            raise StoreInvalid("replication factors must be whole numbers")
    return result


def create_keyspace(keyspace: str, replication: Mapping[str, str], *, tablets_off: bool) -> str:
    """CREATE KEYSPACE, with ``tablets = {'enabled': false}`` on ScyllaDB.

    ScyllaDB does not support lightweight transactions in keyspaces that use
    tablets (the default for new keyspaces since ScyllaDB 6), and every
    commit step here is an LWT, so tablets are switched off. Cassandra has no
    such option and rejects it, hence ``tablets_off`` only when the server is
    a ScyllaDB that knows tablets.
    """
    pairs = ", ".join(f"'{k}': '{v}'" for k, v in replication.items())
    cql = f"CREATE KEYSPACE IF NOT EXISTS {check_keyspace(keyspace)} WITH replication = {{{pairs}}}"
    if tablets_off:
        cql += " AND tablets = {'enabled': false}"
    return cql
