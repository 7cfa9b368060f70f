"""Abandoning a quarantined intent on Scylla (issue 24 item 7).

One LWT on the ``commits`` row turns it into a tombstone: ``state``
``abandoned``, the body dropped, ``expires_at_ms`` the end of the idempotency
window (and a TTL just past it), ``rq_problem`` the audit record (JSON: by,
why, at, seq). It applies only while the row is quarantined, so it never races
a commit. Then, idempotently (rerun by every later abandon of the key): the
queue, creation-view and quarantine rows go, a record written before the
quarantine leaves history, the retention pin is released and the seq is
written as a gap row (kind ``'g'`` of the conversation's partition, TTL the
history retention: past it retention has passed the seq anyway).
"""

from __future__ import annotations

import json

from backends.scylla.codec import BODY_COLUMNS, Row
from backends.scylla.commits import CommitRows, key_of
from backends.scylla.history import pin_removal
from backends.scylla.recovery import RecoveryIndex
from backends.scylla.schema import HISTORY_BUCKET
from backends.scylla.session import CqlSession, Params
from service.domain.errors import StoreCorrupt, StoreOutcomeUnknown
from service.domain.ids import CommitKey
from service.domain.model import Abandonment, AbandonOutcome
from service.domain.ports import Clock, StoreSettings

ABANDONED = "abandoned"
_DROP = ", ".join(
    f"{c} = null"
    for c in (*BODY_COLUMNS, "recipients", "membership_version", "pub_stream", "pub_position",
              "rq_attempts", "rq_due_ms", "rq_quarantined")
)  # fmt: skip
_KEY = "WHERE tenant = ? AND sender = ? AND cmid = ?"
STATEMENTS = {
    "c.abandon": "UPDATE {ks}.commits USING TTL ? SET state = 'abandoned', rq_problem = ?,"
    f" expires_at_ms = ?, {_DROP} {_KEY} IF rq_quarantined = true AND created_at_ms = ?",
    "hist.drop": "DELETE FROM {ks}.history WHERE tenant = ? AND conversation = ? AND bucket = ?"
    " AND seq = ?",
    "gap.put": "INSERT INTO {ks}.conversations (tenant, conversation, kind, name, cmid, seq)"
    " VALUES (?, ?, 'g', ?, '', ?) USING TTL ?",
}


class Abandoner:
    """The abandon of one key, over the rows and indexes the store already has."""

    def __init__(
        self,
        cql: CqlSession,
        rows: CommitRows,
        recovery: RecoveryIndex,
        clock: Clock,
        settings: StoreSettings,
    ) -> None:
        self._cql, self._rows, self._recovery = cql, rows, recovery
        self._clock, self._settings = clock, settings

    async def abandon(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        row = self._rows.live(await self._rows.row(key, serial=True))
        if row is not None and row.get("state") == ABANDONED:
            done = audit_of(row, AbandonOutcome.ALREADY_ABANDONED)
            await self._cleanup(key, row, done)  # finishes a cleanup that stopped
            return done
        if row is None or not row.get("rq_quarantined") or row.get("state") == "committed":
            return Abandonment(AbandonOutcome.NOT_QUARANTINED)
        now, seq = self._clock.now_ms(), int(row.get("seq") or 0)
        audit = json.dumps({"by": operator, "why": reason, "at": now, "seq": seq})
        window = self._settings.idempotency_window_ms
        ttl = window // 1000 + 3600
        params: Params = (ttl, audit, now + window, *key_of(key), row.get("created_at_ms"))
        try:
            applied = await self._cql.cas("c.abandon", params)
        except StoreOutcomeUnknown:
            applied = False  # the read below decides
        if not applied:
            after = self._rows.live(await self._rows.row(key, serial=True))
            if after is None or after.get("state") != ABANDONED:
                return Abandonment(AbandonOutcome.NOT_QUARANTINED)  # committed meanwhile
            row = after
        done = audit_of({**row, "rq_problem": audit} if applied else row, AbandonOutcome.ABANDONED)
        self._rows.known.forget(key)  # nothing of the intent may be driven from memory
        await self._cleanup(key, row, done)
        return done

    async def _cleanup(self, key: CommitKey, row: Row, done: Abandonment) -> None:
        created = int(str(row.get("created_at_ms") or 0))
        writes = [
            self._recovery.created_removal(key, created),
            self._recovery.quarantine_removal(key),
        ]
        due = row.get("rq_due_ms")
        if due is not None:
            writes.append(self._recovery.entry_removal(key, int(str(due))))
        if done.seq:
            t, c, s = key.tenant, done.conversation, done.seq
            retention_s = self._settings.history_retention_ms // 1000 + 1
            writes += [
                ("hist.drop", (t, c, s // HISTORY_BUCKET, s)),
                pin_removal(t, c, s),
                ("gap.put", (t, c, f"{s:020d}", s, retention_s)),
            ]
        await self._cql.write_batch(writes)


def audit_of(row: Row, outcome: AbandonOutcome) -> Abandonment:
    try:
        audit = json.loads(str(row.get("rq_problem") or "{}"))
        return Abandonment(
            outcome, str(row.get("conversation") or ""), int(audit.get("seq", 0)),
            int(audit.get("at", 0)), str(audit.get("by", "")), str(audit.get("why", "")),
        )  # fmt: skip
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreCorrupt("an abandon's audit record could not be decoded") from exc
