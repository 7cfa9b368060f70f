"""The data that migration 2 converts (release 1 → 2), run by ``migrate``.

Release 1's data stays valid with two exceptions, converted here:

* its recovery entries (``recovery_index``, partitions ``ns:<namespace>``) are
  already queue entries due at their creation time; each one of an unfinished
  intent gets the intent's conversation, seq, message id and creation time
  added, an entry in the creation view, and a retention pin for its seq
  (release 1 had no pins, so without this, retention could pass the seq of an
  intent release 1 left unfinished);
* nothing else: conversations, membership, history and the outbox are read
  as release 1 wrote them (``members.py``: release-1 member rows are members
  since the conversation's version at its first change; ``outbox.py``: rows
  without a membership version read with 0).

Idempotent: every write puts the same values again. Stop release-1 replicas
before migrating: they refuse schema 2 anyway (readiness), and an intent one
of them reserved after this ran would miss its pin and creation entry (it is
still in the queue, so recovery finishes it).
"""

from __future__ import annotations

from backends.scylla.recovery import BUCKET_MS, SHARDS, shard_of
from backends.scylla.schema import HISTORY_BUCKET
from backends.scylla.session import CqlSession, Row
from service.domain.ids import CommitKey

PAGE = 1000
MAX_PAGES = 10_000

_NAMESPACES = "SELECT DISTINCT namespace FROM {ks}.recovery_buckets"
_BUCKETS = "SELECT bucket FROM {ks}.recovery_buckets WHERE namespace = %s AND bucket > %s LIMIT %s"
_ENTRIES = (
    "SELECT created_at_ms, tenant, sender, cmid, message_id FROM {ks}.recovery_index"
    " WHERE namespace = %s AND bucket = %s AND shard = %s"
    " AND (created_at_ms, tenant, sender, cmid) > (%s, %s, %s, %s) LIMIT %s"
)
_COMMIT = (
    "SELECT state, conversation, seq, message_id, created_at_ms FROM {ks}.commits"
    " WHERE tenant = %s AND sender = %s AND cmid = %s"
)
_ENTRY = (
    "UPDATE {ks}.recovery_index SET conversation = %s, seq = %s, message_id = %s,"
    " created_ms = %s WHERE namespace = %s AND bucket = %s AND shard = %s"
    " AND created_at_ms = %s AND tenant = %s AND sender = %s AND cmid = %s"
)
_CREATED = (
    "INSERT INTO {ks}.recovery_created (namespace, bucket, shard, created_at_ms, tenant,"
    " sender, cmid) VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
_DIRECTORY = "INSERT INTO {ks}.recovery_buckets (namespace, bucket) VALUES (%s, %s)"
_PIN = "INSERT INTO {ks}.history_pins (tenant, conversation, bucket, seq) VALUES (%s, %s, %s, %s)"


async def convert_release1(cql: CqlSession) -> int:
    """Convert release 1's recovery entries; the number of unfinished intents seen."""
    converted = 0
    for row in await cql.simple(_NAMESPACES):
        partition = str(row["namespace"])
        if partition.startswith("ns:"):
            converted += await _namespace(cql, partition, partition[len("ns:") :])
    return converted


async def _namespace(cql: CqlSession, partition: str, namespace: str) -> int:
    converted, after = 0, -1
    for _ in range(MAX_PAGES):
        buckets = await cql.simple(_BUCKETS, (partition, after, PAGE))
        for b in buckets:
            for shard in range(SHARDS):
                converted += await _shard(cql, partition, namespace, int(b["bucket"]), shard)
        if len(buckets) < PAGE:
            return converted
        after = int(buckets[-1]["bucket"])
    return converted


async def _shard(cql: CqlSession, partition: str, namespace: str, bucket: int, shard: int) -> int:
    converted = 0
    start: tuple[object, ...] = (-1, "", "", "")
    for _ in range(MAX_PAGES):
        rows = await cql.simple(_ENTRIES, (partition, bucket, shard, *start, PAGE))
        for entry in rows:
            if entry.get("message_id") is None and await _entry(cql, partition, namespace, entry):
                converted += 1
        if len(rows) < PAGE:
            return converted
        last = rows[-1]
        start = (last["created_at_ms"], last["tenant"], last["sender"], last["cmid"])
    return converted


async def _entry(cql: CqlSession, partition: str, namespace: str, entry: Row) -> bool:
    key = CommitKey(entry["tenant"], entry["sender"], entry["cmid"])
    due = int(entry["created_at_ms"])
    rows = await cql.simple(_COMMIT, (key.tenant, key.sender, key.cmid))
    if not rows or rows[0].get("state") in (None, "committed"):
        return False  # stale: a scan drops it
    commit = rows[0]
    if commit.get("created_at_ms") != due or commit.get("seq") is None:
        return False
    conversation, seq = str(commit["conversation"]), int(commit["seq"])
    bucket = due // BUCKET_MS
    await cql.simple(
        _ENTRY,
        (conversation, seq, commit.get("message_id"), due, partition, bucket, shard_of(key), due,
         key.tenant, key.sender, key.cmid),
    )  # fmt: skip
    created = f"created:{namespace}"
    await cql.simple(_CREATED, (created, bucket, shard_of(key), due, *_key(key)))
    await cql.simple(_DIRECTORY, (created, bucket))
    await cql.simple(_PIN, (key.tenant, conversation, seq // HISTORY_BUCKET, seq))
    return True


def _key(key: CommitKey) -> tuple[str, str, str]:
    return (key.tenant, key.sender, key.cmid)
