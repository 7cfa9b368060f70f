"""The delivery tables (schema version 3): the partitioned outbox, relay leases and
dead letters, mailboxes, the per-user conversation index.

=======================  ===================================  =====================================
table                    partition / clustering               access path
=======================  ===================================  =====================================
outbox_log               (namespace, part, bucket) /          the outbox, cut into PARTITIONS by
                         position (timeuuid)                  conversation and into hour buckets
outbox_buckets           (namespace, part) / bucket           hours of a partition that hold entries
relay_leases             (namespace, part)                    lease owner, fencing token, expiry,
                                                              acknowledged-through time, retry marks
relay_dead_letters       (namespace, part) / letter           dead-lettered entries and why
relay_members            (namespace) / owner                  live relays (rows with a TTL)
mailboxes                (tenant, kind, owner) / row_kind,    one mailbox lane: statics epoch, head,
                         seq, message_id                      watermark, version, fences; rows 'e'
                                                              entries, 'i' dedupe ids, 'g' groups
user_conversations       (tenant, member) / conversation      the per-user conversation index
user_left                (tenant, member) / left_ms,          the conversations a user left, by
                         conversation                         time (schema 6)
=======================  ===================================  =====================================

Release 1's (and schema 2's) ``outbox`` table stays: the relay drains it as
the partition ``scylla:legacy``; new commits publish to ``outbox_log``.

Schema 4 adds ``mailboxes.membership_version``: the membership version an
entry's message was frozen at (``service.domain.mailbox.readable``). Entries
written before it read as 0 (unknown).

Schema 6 adds ``user_left`` (``LEFT_TABLE``): one row per departure, read as a
clustering slice from a time, so departures older than the reader's bound
(at most History's retention) are never read. A conversation left twice has
two rows; the listing keeps the latest of a page.
"""

from __future__ import annotations

from backends.scylla.codec import BODY_COLUMNS

_BODY = ", ".join(
    f"{c} {t}"
    for c, t in zip(
        BODY_COLUMNS,
        ("text", "text", "text", "blob", "text", "bigint", "text", "frozen<list<text>>", "text"),
        strict=True,
    )
)

DESCRIPTION = "delivery: partitioned outbox, relay leases and dead letters, mailboxes, user index"

TABLES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS {ks}.outbox_log (
    namespace text, part int, bucket bigint, position timeuuid,
    tenant text, conversation text, seq bigint, message_id text,
    recipients frozen<list<text>>, membership_version bigint,
    PRIMARY KEY ((namespace, part, bucket), position)
) WITH comment = 'the outbox, by partition and hour'""",
    """CREATE TABLE IF NOT EXISTS {ks}.outbox_buckets (
    namespace text, part int, bucket bigint,
    PRIMARY KEY ((namespace, part), bucket)
) WITH comment = 'hours of an outbox partition that hold entries'""",
    """CREATE TABLE IF NOT EXISTS {ks}.relay_leases (
    namespace text, part text,
    owner text, fence_token bigint, expires_at_ms bigint, acked_ms bigint,
    retries map<timeuuid, text>,
    PRIMARY KEY ((namespace, part))
) WITH comment = 'relay lease and progress of one outbox partition'""",
    """CREATE TABLE IF NOT EXISTS {ks}.relay_dead_letters (
    namespace text, part text, letter timeuuid, position timeuuid,
    tenant text, conversation text, seq bigint, message_id text,
    recipients frozen<list<text>>, membership_version bigint,
    problem text, attempts int,
    PRIMARY KEY ((namespace, part), letter)
) WITH comment = 'outbox entries the relay gave up on'""",
    """CREATE TABLE IF NOT EXISTS {ks}.relay_members (
    namespace text, owner text,
    PRIMARY KEY ((namespace), owner)
) WITH gc_grace_seconds = 3600 AND comment = 'live relays'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.mailboxes (
    tenant text, kind text, owner text, row_kind text, seq bigint, message_id text,
    epoch bigint static, head bigint static, watermark bigint static, version bigint static,
    fences map<text, bigint> static, first_ms bigint static,
    group_id bigint, appended_ms bigint, at_seq bigint,
    conversation text, conv_seq bigint, sender text, cmid text, server_ts_ms bigint,
    {_BODY},
    PRIMARY KEY ((tenant, kind, owner), row_kind, seq, message_id)
) WITH comment = 'mailbox lanes'""",
    """CREATE TABLE IF NOT EXISTS {ks}.user_conversations (
    tenant text, member text, conversation text,
    PRIMARY KEY ((tenant, member), conversation)
) WITH comment = 'the conversations of a user (confirmed by admission on read)'""",
)

LEFT_TABLE = """CREATE TABLE IF NOT EXISTS {ks}.user_left (
    tenant text, member text, left_ms bigint, conversation text, version bigint,
    PRIMARY KEY ((tenant, member), left_ms, conversation)
) WITH comment = 'the conversations a user left, by time (confirmed by admission on read)'"""
