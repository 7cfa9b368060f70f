"""Hand-made mutants of the Scylla backend: its conditional writes (the ``IF``
clauses) and the decisions it takes from a serial re-read.

A CQL mutant keeps the statement valid and its bind markers unchanged (one
that fails to prepare would be "killed" by a syntax error, which proves
nothing), so the conditions are weakened, never removed.

Run with a CQL node (``docs/mutation.md``)::

    MC_TEST_CQL_CONTACT=127.0.0.1:40011 .venv/bin/python -m tests.mutation.run cql
"""

# ruff: noqa: E501  (the texts are exact lines of the mutated sources)

from __future__ import annotations

from tests.mutation.hook import Edit, Mutant, Promise

STORE = "backends.scylla.store"
SEQUENCE = "backends.scylla.sequence"
MEMBERS = "backends.scylla.members"
HISTORY = "backends.scylla.history"
QUEUE = "backends.scylla.recovery_queue"
COMMITS = "backends.scylla.commits"


def _cql(id: str, promise: Promise, what: str, module: str, old: str, new: str) -> Mutant:
    return Mutant(id, "cql", promise, what, (Edit(module, old, new),))


CQL_MUTANTS: tuple[Mutant, ...] = (
    # --- IF clauses ------------------------------------------------------------------
    _cql(
        "scylla-if-seq-counter-not-exact", "seq",
        "the seq counter CAS accepts a stale expected value (IF last_seq >= ?)",
        SEQUENCE, '" WHERE tenant = ? AND conversation = ? IF last_seq = ?",',
        '" WHERE tenant = ? AND conversation = ? IF last_seq >= ?",',
    ),
    _cql(
        "scylla-if-outboxed-any-state", "ACK",
        "the publish-mark applies in any state (a committed row goes back to outboxed)",
        STORE, "IF state = 'reserved' AND message_id = ?\",\n    \"c.commit\"",
        "IF message_id = ?\",\n    \"c.commit\"",
    ),
    _cql(
        "scylla-if-commit-any-state", "ACK",
        "the commit-mark applies without the publish-mark (IF message_id = ? only)",
        STORE,
        "f\" {_KEY} IF state = 'outboxed' AND message_id = ? AND pub_stream = ? AND pub_position = ?\",",
        "f\" {_KEY} IF message_id = ? AND pub_stream = ? AND pub_position = ?\",",
    ),
    _cql(
        "scylla-if-defer-any-intent", "recovery",
        "defer_recovery applies to a newer intent of the key (IF created_at_ms >= ?)",
        QUEUE, 'f" rq_quarantined = ? {_KEY} IF created_at_ms = ?",',
        'f" rq_quarantined = ? {_KEY} IF created_at_ms >= ?",',
    ),
    _cql(
        "scylla-if-membership-bump-not-exact", "authorisation",
        "a membership change applies over a concurrent one (IF version >= ?)",
        MEMBERS, 'f" {_WHERE} IF version = ?",', 'f" {_WHERE} IF version >= ?",',
    ),
    # --- decisions after a refused or unknown conditional write -----------------------------
    _cql(
        "scylla-reserve-reread-any-row-is-ours", "conflict",
        "after a refused intent write, any row at the key is taken as our reservation",
        STORE,
        "            if row is not None and _same_coordinates(row, intent.record):\n",
        "            if row is not None:\n",
    ),
    _cql(
        "scylla-seq-unknown-outcome-is-applied", "seq",
        "an unknown outcome of the seq CAS is taken as applied",
        SEQUENCE,
        "            except StoreOutcomeUnknown:\n"
        "                applied, rows = False, []  # the serial reads below tell what applied\n",
        "            except StoreOutcomeUnknown:\n"
        "                applied, rows = True, []\n",
    ),
    _cql(
        "scylla-seq-stale-reservation-reused", "seq",
        "a key reserved again after its window reuses the seq of its expired commit",
        SEQUENCE, "            if seq is not None and seq != ask.stale:\n",
        "            if seq is not None:\n",
    ),
    _cql(
        "scylla-publish-reread-not-checked", "ACK",
        "a publish-mark that did not apply is taken as applied",
        STORE,
        "        if not _has_publication(after, publication):\n"
        '            raise StoreOutcomeUnknown("scylla: the publish-mark did not apply")\n',
        "",
    ),
    _cql(
        "scylla-commit-reread-not-checked", "ACK",
        "a commit-mark that did not apply still gives an ACK",
        STORE,
        "            raise StoreConflict(\"a different publication is already recorded\")\n"
        '        raise StoreOutcomeUnknown("scylla: the commit-mark did not apply")\n',
        "            raise StoreConflict(\"a different publication is already recorded\")\n"
        "        return self._clock.now_ms()\n",
    ),
    _cql(
        "scylla-commit-unknown-is-applied", "ACK",
        "an unknown outcome of the commit-mark is an ACK without a serial re-read",
        STORE,
        "        except StoreOutcomeUnknown:\n"
        "            applied = False\n"
        "        if not applied:\n"
        "            now = await self._commit_refused(",
        "        except StoreOutcomeUnknown:\n"
        "            applied = True\n"
        "        if not applied:\n"
        "            now = await self._commit_refused(",
    ),
    _cql(
        "scylla-create-refused-is-created", "authorisation",
        "creating an existing conversation reports success",
        MEMBERS,
        "        if not applied:\n"
        '            raise StoreAlreadyExists("conversation already exists")\n',
        "",
    ),
    # --- reads that decide -----------------------------------------------------------------
    _cql(
        "scylla-stored-committed-other-message", "ACK",
        "a committed row of another message id is taken as this intent's commit",
        STORE,
        "            if row.get(\"message_id\") != intent.record.message_id:\n"
        '                raise StoreConflict("intent does not match the stored one")\n'
        "            return row, None\n",
        "            return row, None\n",
    ),
    _cql(
        "scylla-stored-other-record", "conflict",
        "an unfinished row with another record is taken as this intent",
        STORE,
        "        if stored.record != intent.record:\n"
        '            raise StoreConflict("intent does not match the stored one")\n',
        "",
    ),
    _cql(
        "scylla-existing-no-identity-compare", "conflict",
        "reserve of a known key with a different request is not a conflict",
        STORE,
        "        if not request.matches_identity(row.get(\"identity\") or b\"\"):\n"
        "            return Conflict(request.key)\n",
        "",
    ),
    _cql(
        "scylla-expired-at-expiry-is-live", "ACK",
        "a committed row is still live at its expiry instant",
        COMMITS, "            and expires <= self._clock.now_ms()\n",
        "            and expires < self._clock.now_ms()\n",
    ),
    _cql(
        "scylla-judge-no-absent-grace", "recovery",
        "a recovery entry whose intent is not written yet is dropped at once",
        QUEUE,
        "            if entry.created_at_ms >= self._clock.now_ms() - ABSENT_ENTRY_GRACE_MS:\n",
        "            if False:\n",
    ),
    _cql(
        "scylla-judge-any-intent-is-mine", "recovery",
        "a recovery entry is taken as the entry of whatever intent holds the key now",
        QUEUE,
        "        if row.get(\"created_at_ms\") != entry.created_at_ms:\n"
        "            await self._rows.quietly(self._stale(entry, row))\n"
        "            return None\n"
        "        if row.get(\"rq_quarantined\"):\n",
        "        if row.get(\"rq_quarantined\"):\n",
    ),
    _cql(
        "scylla-defer-any-intent", "recovery",
        "defer_recovery records a failure on a newer intent of the key",
        QUEUE, "            or row.get(\"created_at_ms\") != item.created_at_ms\n", "",
    ),
    _cql(
        "scylla-history-no-member-check", "authorisation",
        "history pages are served to non-members",
        HISTORY,
        "        reader = reader_of(intervals)\n",
        "        reader = intervals or (1,)\n",
    ),
    _cql(
        "scylla-member-now-next-user", "authorisation",
        "the membership point lookup takes the next user's row for the asked one",
        MEMBERS,
        '        if row.get("kind") != "m" or row.get("name") != user:\n'
        "            return (), found\n",
        "",
    ),
    _cql(
        "scylla-floor-ignores-open-pins", "recovery",
        "retention passes the pins of unfinished intents (only timed pins hold it)",
        HISTORY, "                    if until is None or until > now:\n",
        "                    if until is not None and until > now:\n",
    ),
    _cql(
        "scylla-late-commit-unpinned", "ACK",
        "a commit after retention passed its seq drops the pin: its record can go at once",
        HISTORY,
        "        if created_at_ms <= committed_ms - self.retention_ms + LATE_MARGIN_MS:\n",
        "        if False:\n",
    ),
)  # fmt: skip
