"""RedisMessageStore: the MessageStore on Redis.

It mirrors ``backends.memory`` step for step (that package is the behavioural
spec); each transition is one script of ``backends.redis.commits``. Time is
Redis's own (``TIME`` inside every script): expiry, the idempotency window,
retention and the recovery queue are decided by the server, whatever the
clocks of the replicas say. Retention is logical: committed records and
history carry their expiry instants and read as absent once passed; a TTL
on the compact commit and its key pointer (the window plus
``PHYSICAL_GRACE_MS``) reclaims the memory, and history is trimmed as a
prefix by the scripts that touch the conversation, never past an unfinished
intent's seq.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, cast

from backends.recovery_delegation import DelegatedRecovery
from backends.redis import abandon, codec, history
from backends.redis.commits import (
    COMMIT,
    OUTBOX_APPEND,
    PUBLISH,
    PUT_RECORD,
    RESERVE,
    CommitCalls,
    raise_conflict,
    status,
)
from backends.redis.deployment import check_eviction, check_identity
from backends.redis.link import Arg, WriteRefused
from backends.redis.lua import Script
from backends.redis.members import ADMISSION
from backends.redis.outbox import RedisOutbox
from backends.redis.recovery import RedisRecoveryQueue
from backends.redis.replication import Replication
from service.domain.errors import StoreConflict, StoreCorrupt, StoreInvalid, StoreNotFound
from service.domain.identity import WHOLE_HEADER, as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
    Abandoned,
    Abandonment,
    Admission,
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    Conflict,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    LoadedCommit,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Hook, MessageStore, Outbox, StoredCommit, StoreSettings

PHYSICAL_GRACE_MS = 10 * 60 * 1000
"""Added to the TTL of compact records: logical expiry decides, the TTL only
cleans up after it."""


class RedisMessageStore(DelegatedRecovery, MessageStore):
    """MessageStore over one Redis deployment (see the package docs)."""

    atomic_publish_commit = True

    def __init__(
        self,
        calls: CommitCalls,
        settings: StoreSettings,
        identity_form: Literal["digest", "whole"] = "digest",
        allow_eviction: bool = False,
        scripts: tuple[Script, ...] = (),
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self._calls = calls
        self._keys = calls.keys
        self._settings = settings
        self._whole_identity = identity_form == "whole"  # what versions < 1 wrote
        self._allow_eviction = allow_eviction
        self._scripts = scripts
        self._queue = RedisRecoveryQueue(calls)
        self.replication = Replication(calls.link, calls.keys, wait_replicas, wait_timeout_ms)
        self._replication = self.replication

    # --- answers that wait for replicas (replication.py) -----------------------

    async def _replicated(
        self, loaded: LoadedCommit | None, tenant: str, conv: str, acked: int | None = None
    ) -> None:
        """Before a committed result or a conflict is answered, replicas hold it
        (``acked``: the count of the barrier sent with the reserve that answered)."""
        if isinstance(loaded, Committed | Conflict):
            await self._replication.confirm(tenant, conv, acked)

    async def _conflict(self, key: CommitKey, conv: str, acked: int | None = None) -> Conflict:
        conflict = Conflict(key)
        await self._replicated(conflict, key.tenant, conv, acked)
        return conflict

    # --- reserve and load --------------------------------------------------

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        result = await self._reserve(request, delivery, candidate, admit=False)
        assert not isinstance(result, Admission) and result is not None
        return result

    @property
    def admits_in_reserve(self) -> bool:  # type: ignore[override]
        """Standalone and Sentinel: the admission lookup is part of the reserve
        script. A Cluster claims the key's pointer first (another slot), which
        must not happen for a sender who is then refused: it asks first."""
        return not self._calls.link.cluster

    async def reserve_admitted(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> ReserveResult | Admission | None:
        return await self._reserve(request, delivery, candidate, admit=True)

    async def _reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
        *,
        admit: bool,
    ) -> ReserveResult | Admission | None:
        key, conv = request.key, request.conversation
        ck = self._keys.conversation(key.tenant, conv)
        identity = request.stored_identity(self._whole_identity)
        record = request.record_at(0, candidate)  # the script allocates its seq
        shard = ck.shard
        frozen = b"" if delivery is None else codec.encode_delivery(delivery)
        try:
            if not await self._calls.claim(key, conv):
                return await self._conflict(key, conv)
            # With replicas: reserve, the shard's barrier and WAIT in one round trip
            # on one connection (replication.py), so an answer that rests on stored
            # state waits for replicas of the server that gave it.
            reply, acked = await self._replication.write(
                RESERVE,
                [shard.identity, ck.meta, ck.commit(key.sender, key.cmid), ck.pinned,
                 shard.queue, shard.created, shard.attempts, ck.intervals,
                 *self._calls.pointer_keys(key)],
                [*self._calls.head(), conv, identity, codec.encode_record(record),
                 candidate.message_id, candidate.server_ts_ms, frozen,
                 self._keys.queue_member(key.tenant, conv, key.sender, key.cmid),
                 request.sender if admit else ""],
                shard.barrier,
            )  # fmt: skip
        except WriteRefused:
            # Out of memory or a read-only replica: a retry of a known key can
            # still be answered from what is stored (replays keep working), and
            # a sender who is not admitted is still told so.
            known = await self.load_commit_for_request(request)
            if known is not None:
                return known
            if admit:
                admission = await self._admission(request)
                if admission is None or not admission.member:
                    return admission
            raise
        word, rest = status(reply)
        if word == b"reserved" and len(rest) == 3:
            # A fresh reservation rests on nothing stored before it: ``acked`` is
            # not checked, the commit pipeline's own WAIT decides the ACK.
            intent = CommitIntent(
                key=key,
                identity=identity,
                record=replace(record, seq=codec.to_int(rest[0])),
                delivery=delivery or FrozenDeliveryInput.at_version(codec.to_int(rest[2])),
                state=CommitState.RESERVED,
                created_at_ms=codec.to_int(rest[1]),
            )
            return Reserved(intent)
        if word == b"notmember" and admit and len(rest) == 1:
            await self._replication.confirm(key.tenant, conv, acked)  # a refusal waits too
            return Admission(codec.to_int(rest[0]), False)
        if word == b"noconv" and admit:
            await self._replication.confirm(key.tenant, conv, acked)
            return None
        if word == b"exists":
            fields = codec.pairs(rest[0] if rest else [])
            if _abandoned(fields):
                return Abandoned(key)
            if not request.matches_identity(fields.get(b"id", b"")):
                return await self._conflict(key, conv, acked)
            loaded = _interpret(fields, key, conv)
            await self._replicated(loaded, key.tenant, conv, acked)
            return loaded
        if word == b"other":
            return await self._conflict(key, conv, acked)
        if word == b"noconv":
            await self._replication.confirm(key.tenant, conv, acked)
            raise StoreNotFound("conversation not found")
        raise StoreCorrupt("redis gave an unexpected reply")

    async def _admission(self, request: AuthenticatedSend) -> Admission | None:
        """The membership store's point lookup, for when reserve could not run."""
        ck = self._keys.conversation(request.tenant, request.conversation)
        word, rest = await self._calls.run(
            ADMISSION, [ck.shard.identity, ck.meta, ck.intervals], [request.sender], write=False
        )
        if word == b"ok" and len(rest) == 2:
            return Admission(codec.to_int(rest[0]), codec.to_int(rest[1]) == 1)
        if word == b"none":
            return None
        raise StoreCorrupt("redis gave an unexpected reply")

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        fields, _ = await self._calls.load_in(key, conversation)
        loaded = None if fields is None else _interpret(fields, key, conversation)
        await self._replicated(loaded, key.tenant, conversation)
        return loaded

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        fields, elsewhere = await self._calls.load_in(request.key, request.conversation)
        if fields is None:
            return await self._conflict(request.key, request.conversation) if elsewhere else None
        if not _abandoned(fields) and not request.matches_identity(fields.get(b"id", b"")):
            return await self._conflict(request.key, request.conversation)
        loaded = _interpret(fields, request.key, request.conversation)
        await self._replicated(loaded, request.key.tenant, request.conversation)
        return loaded

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        conversation = await self._calls.pointed_conversation(key)
        if conversation is None:
            return None
        fields, _ = await self._calls.load_in(key, conversation)
        if fields is None:
            return None
        identity = fields.get(b"id", b"")
        if _abandoned(fields):
            return StoredCommit(identity, conversation, None, None, abandoned=True)
        loaded = _interpret(fields, key, conversation)
        if isinstance(loaded, Committed):
            return StoredCommit(identity, conversation, None, loaded.message)
        assert isinstance(loaded, InProgress)
        return StoredCommit(identity, conversation, loaded.intent, None)

    # --- transitions ---------------------------------------------------------

    def _intent_args(self, intent: CommitIntent) -> tuple[list[str], list[object]]:
        key, record = intent.key, intent.record
        if (record.tenant, record.sender, record.cmid) != (key.tenant, key.sender, key.cmid):
            raise StoreConflict("intent does not match the stored one")
        ck = self._keys.conversation(key.tenant, record.conversation)
        keys = self._calls.transition_keys(ck, ck.commit(key.sender, key.cmid))
        return keys, [record.seq, codec.encode_record(record), record.message_id]

    async def put_record(self, intent: CommitIntent) -> None:
        keys, args = self._intent_args(intent)
        word, rest = await self._calls.run(
            PUT_RECORD, keys, [*args, intent.delivery.reading_version]
        )
        if word == b"conflict":
            raise_conflict(rest)

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        keys, args = self._intent_args(intent)
        word, rest = await self._calls.run(
            PUBLISH, keys, [*args, publication.stream, publication.position]
        )
        if word == b"conflict":
            raise_conflict(rest)

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication, between: Hook | None = None
    ) -> CommittedMessage:
        return await self._commit(intent, publication)

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        return await self._commit(intent, None)

    def _commit_call(
        self,
        intent: CommitIntent,
        mode: str,
        stream: str,
        position: str,
        intent_args: tuple[list[str], list[object]] | None = None,
    ) -> tuple[list[str], list[Arg]]:
        """KEYS and ARGV (its head included) of the commit script in ``mode``
        (``intent_args``: ``_intent_args(intent)`` when the caller has it)."""
        keys, args = intent_args or self._intent_args(intent)
        key, conv = intent.key, intent.conversation
        shard = self._keys.conversation(key.tenant, conv).shard
        s = self._settings
        ttl = s.idempotency_window_ms + PHYSICAL_GRACE_MS
        whole = intent.identity if intent.identity.startswith(WHOLE_HEADER) else b""
        commit_keys = [*keys, shard.queue, shard.created, shard.attempts, shard.quarantine,
                       *self._calls.pointer_keys(key)]  # fmt: skip
        commit_args = [*args, mode, stream, position,
             s.idempotency_window_ms, ttl, s.history_retention_ms,
             self._keys.queue_member(key.tenant, conv, key.sender, key.cmid), conv,
             as_digest(intent.identity), whole]  # fmt: skip
        return commit_keys, cast(list[Arg], [*self._calls.head(), *commit_args])

    async def _commit(
        self, intent: CommitIntent, publication: OutboxPublication | None
    ) -> CommittedMessage:
        """One script for both COMMITTED steps: compact, leave the queue, unpin,
        register the expiries."""
        commit_keys, commit_args = self._commit_call(
            intent,
            "pc" if publication is not None else "c",
            publication.stream if publication else "",
            publication.position if publication else "",
        )
        replication = self._replication
        if replication.replicas:
            reply, acked = await self._calls.link.script_and_wait(
                COMMIT, commit_keys, commit_args, replication.replicas, replication.wait_ms
            )
        else:
            reply, acked = await self._calls.link.script(COMMIT, commit_keys, commit_args), 0
        return await self._committed(intent, reply, acked)

    async def _committed(self, intent: CommitIntent, reply: Any, acked: int) -> CommittedMessage:
        """The CommittedMessage of the commit script's ``reply`` (``acked``: the
        replicas that acknowledged it, when this deployment waits for any)."""
        word, rest = status(reply)
        if word == b"committed" and self._replication.replicas:
            self._replication.check(acked)
        if word == b"conflict":
            raise_conflict(rest)
        if word != b"committed" or len(rest) != 3:
            raise StoreCorrupt("redis gave an unexpected reply")
        key, conv, s = intent.key, intent.conversation, self._settings
        ttl = s.idempotency_window_ms + PHYSICAL_GRACE_MS
        await self._calls.expire_pointer(key, conv, s.idempotency_window_ms, ttl)
        return CommittedMessage(
            conversation=conv,
            cmid=key.cmid,
            message_id=codec.to_str(rest[0]),
            seq=codec.to_int(rest[1]),
            server_ts_ms=codec.to_int(rest[2]),
        )

    # --- a fresh commit's last three steps in one round trip ---------------------

    def pipelines_with(self, outbox: Outbox) -> bool:
        """Only with this deployment's own outbox streams, and not on a Cluster
        (its commits also expire the key's pointer in another slot). Tracing's
        wrapper is looked through."""
        link, outbox = self._calls.link, outbox.underlying()
        return not link.cluster and isinstance(outbox, RedisOutbox) and outbox.link is link

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        """put_record, outbox_append and commit (mode 'po'), each its own script,
        sent in one pipeline: each checks the state the one before leaves, so a
        step refused leaves RESERVED or RECORDED and the later ones refuse too."""
        outbox = outbox.underlying()
        if not isinstance(outbox, RedisOutbox) or not 1 <= steps <= 3:
            raise StoreInvalid("this outbox cannot be pipelined with this store")
        keys, args = self._intent_args(intent)
        head = self._calls.head()
        r = intent.record
        stream = outbox.stream_of(r.tenant, r.conversation)
        commit_keys, commit_args = self._commit_call(intent, "po", stream, "", (keys, args))
        append: list[Arg] = [*head, r.seq, r.message_id, *outbox.entry_fields(intent)]
        calls: list[tuple[Script, list[str], list[Arg]]] = [
            (PUT_RECORD, keys, cast(list[Arg], [*head, *args, intent.delivery.reading_version])),
            (OUTBOX_APPEND, [keys[0], keys[1], keys[3], stream], append),
            (COMMIT, commit_keys, commit_args),
        ][:steps]
        replication = self._replication
        wait = (replication.replicas, replication.wait_ms) if replication.replicas else None
        replies, acked = await self._calls.link.script_pipeline(calls, wait if steps == 3 else None)
        for reply in replies[:2]:
            word, rest = status(reply)
            if word == b"conflict":
                raise_conflict(rest)
            if word not in (b"ok", b"appended"):
                raise StoreCorrupt("redis gave an unexpected reply")
        if steps < 3:
            return None
        return await self._committed(intent, replies[2], acked)

    # --- the recovery queue ------------------------------------------------------

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        s = self._settings
        return await abandon.abandon_quarantined(
            self._calls, key, operator, reason,
            window_ms=s.idempotency_window_ms, ttl_ms=s.idempotency_window_ms + PHYSICAL_GRACE_MS,
        )  # fmt: skip

    # --- history and readiness ---------------------------------------------------

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        return await history.history_page(self._calls, self._replication, query)

    async def readiness(self) -> None:
        """PING-level reachability, this deployment's identity on every shard,
        a non-evicting memory policy, and the scripts loaded on every server."""
        link = self._calls.link
        await check_identity(link, self._keys, self._calls.deployment)
        await check_eviction(link, allow=self._allow_eviction)
        await link.scripts_ready(self._scripts)


def _abandoned(fields: dict[bytes, bytes]) -> bool:
    return fields.get(b"st") == b"A"


def _interpret(fields: dict[bytes, bytes], key: CommitKey, conversation: str) -> LoadedCommit:
    if _abandoned(fields):
        return Abandoned(key)
    if codec.state_of(fields) is CommitState.COMMITTED:
        return Committed(codec.committed_of(fields, conversation, key.cmid))
    return InProgress(codec.intent_of(fields, key, conversation))
