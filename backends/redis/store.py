"""RedisMessageStore: the MessageStore and MembershipStore on Redis.

It mirrors ``backends.memory`` step for step (that module is the
behavioural spec); each transition is one script from
``backends.redis.scripts`` over the keys of ``backends.redis.keys``.
Retention is logical: committed records and history carry their expiry
instants (from the injected clock) and read as absent once passed; a TTL
on the compact commit and its key pointer (the logical lifetime plus
``PHYSICAL_GRACE_MS``, relative, so clock skew between the service and the
server cannot drop a record early) reclaims the memory, and history is
trimmed as a prefix by the scripts that touch the conversation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Literal

from backends.redis import codec, scripts
from backends.redis.keys import ConversationKeys, KeySpace
from backends.redis.link import RedisLink, WriteRefused
from service.domain.errors import (
    StoreAlreadyExists,
    StoreConflict,
    StoreCorrupt,
    StoreForbidden,
    StoreNotFound,
)
from service.domain.history import build_page
from service.domain.identity import WHOLE_HEADER, as_digest
from service.domain.ids import CommitKey
from service.domain.model import (
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    Conflict,
    Direction,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    LoadedCommit,
    Membership,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import (
    Clock,
    MembershipStore,
    MessageStore,
    StoredCommit,
    StoreSettings,
)

PHYSICAL_GRACE_MS = 10 * 60 * 1000
"""Added to the TTL of compact records: logical expiry decides, the TTL only
cleans up after it."""

_CONFLICTS = {
    "absent": "no intent for this key",
    "mismatch": "intent does not match the stored one",
    "publication": "a different publication is already recorded",
    "state": "the record is not written yet",
    "record": "the record is missing from history",
}


def _status(reply: Any) -> tuple[bytes, list[Any]]:
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], bytes):
        raise StoreCorrupt("redis gave an unexpected reply")
    return reply[0], reply[1:]


def _raise_conflict(rest: list[Any]) -> None:
    reason = rest[0].decode("ascii", "replace") if rest and isinstance(rest[0], bytes) else ""
    raise StoreConflict(_CONFLICTS.get(reason, "the stored state does not allow this step"))


class RedisMessageStore(MessageStore, MembershipStore):
    """MessageStore and MembershipStore over one Redis (see the package docs)."""

    atomic_publish_commit = True

    def __init__(
        self,
        link: RedisLink,
        keys: KeySpace,
        settings: StoreSettings,
        clock: Clock,
        identity_form: Literal["digest", "whole"] = "digest",
    ) -> None:
        self._link = link
        self._keys = keys
        self._settings = settings
        self._clock = clock
        self._whole_identity = identity_form == "whole"  # what versions < 1 wrote

    def _now(self) -> str:
        return str(self._clock.now_ms())

    # --- reserve and load --------------------------------------------------

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        key, conv = request.key, request.conversation
        ck = self._keys.conversation(key.tenant, conv)
        identity = request.stored_identity(self._whole_identity)
        now = self._now()
        # The record as history will hold it; the script allocates its seq.
        record = request.record_at(0, candidate)
        try:
            reply = await self._link.script(
                scripts.RESERVE_SCRIPT,
                [
                    ck.meta,
                    ck.commit(key.sender, key.cmid),
                    self._keys.pointer(key.tenant, key.sender, key.cmid),
                    self._keys.recovery,
                ],
                [
                    now,
                    conv,
                    identity,
                    codec.encode_record(record),
                    candidate.message_id,
                    candidate.server_ts_ms,
                    codec.encode_delivery(delivery),
                    self._keys.recovery_member(key.tenant, conv, key.sender, key.cmid),
                ],
            )
        except WriteRefused:
            # Out of memory or a read-only replica: a retry of a known key can
            # still be answered from what is stored (replays keep working).
            known = await self.load_commit_for_request(request)
            if known is None:
                raise
            return known
        status, rest = _status(reply)
        if status == b"reserved":
            seq = codec.to_int(rest[0] if rest else None)
            intent = CommitIntent(
                key=key,
                identity=identity,
                record=replace(record, seq=seq),
                delivery=delivery,
                state=CommitState.RESERVED,
                created_at_ms=int(now),
            )
            return Reserved(intent)
        if status == b"exists":
            fields = codec.pairs(rest[0] if rest else [])
            if not request.matches_identity(fields.get(b"id", b"")):
                return Conflict(key)
            return _interpret(fields, key, conv)
        if status == b"other":
            return Conflict(key)
        if status == b"noconv":
            raise StoreNotFound("conversation not found")
        raise StoreCorrupt("redis gave an unexpected reply")

    async def _load_in(
        self, key: CommitKey, conversation: str
    ) -> tuple[dict[bytes, bytes] | None, bool]:
        """(fields of the live commit in ``conversation`` or None, whether the
        key is live in another conversation)."""
        ck = self._keys.conversation(key.tenant, conversation)
        reply = await self._link.script(
            scripts.LOAD_SCRIPT,
            [ck.commit(key.sender, key.cmid), self._keys.pointer(key.tenant, key.sender, key.cmid)],
            [self._now(), conversation],
            write=False,
        )
        status, rest = _status(reply)
        if status == b"here":
            return codec.pairs(rest[0] if rest else []), False
        if status in (b"other", b"none"):
            return None, status == b"other"
        raise StoreCorrupt("redis gave an unexpected reply")

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        fields, _ = await self._load_in(key, conversation)
        return None if fields is None else _interpret(fields, key, conversation)

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        fields, elsewhere = await self._load_in(request.key, request.conversation)
        if fields is None:
            return Conflict(request.key) if elsewhere else None
        if not request.matches_identity(fields.get(b"id", b"")):
            return Conflict(request.key)
        return _interpret(fields, request.key, request.conversation)

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        pointer = await self._link.call(
            "HMGET", self._keys.pointer(key.tenant, key.sender, key.cmid), "c", "x", write=False
        )
        if not isinstance(pointer, list) or len(pointer) != 2 or pointer[0] is None:
            return None
        if pointer[1] is not None and codec.to_int(pointer[1]) <= self._clock.now_ms():
            return None
        conversation = codec.to_str(pointer[0])
        fields, _ = await self._load_in(key, conversation)
        if fields is None:
            return None
        identity = fields.get(b"id", b"")
        loaded = _interpret(fields, key, conversation)
        if isinstance(loaded, Committed):
            return StoredCommit(identity, conversation, None, loaded.message)
        assert isinstance(loaded, InProgress)
        return StoredCommit(identity, conversation, loaded.intent, None)

    # --- transitions ---------------------------------------------------------

    def _intent_args(self, intent: CommitIntent) -> tuple[ConversationKeys, str, list[Any]]:
        key, record = intent.key, intent.record
        if (record.tenant, record.sender, record.cmid) != (key.tenant, key.sender, key.cmid):
            raise StoreConflict("intent does not match the stored one")
        ck = self._keys.conversation(key.tenant, record.conversation)
        commit_key = ck.commit(key.sender, key.cmid)
        args = [self._now(), record.seq, codec.encode_record(record), record.message_id]
        return ck, commit_key, args

    async def put_record(self, intent: CommitIntent) -> None:
        ck, commit_key, args = self._intent_args(intent)
        reply = await self._link.script(
            scripts.PUT_RECORD_SCRIPT, [commit_key, ck.meta, ck.history, ck.expiry], args
        )
        status, rest = _status(reply)
        if status == b"conflict":
            _raise_conflict(rest)

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        ck, commit_key, args = self._intent_args(intent)
        reply = await self._link.script(
            scripts.PUBLISH_SCRIPT,
            [commit_key, ck.meta, ck.history, ck.expiry],
            [*args, publication.stream, publication.position],
        )
        status, rest = _status(reply)
        if status == b"conflict":
            _raise_conflict(rest)

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> CommittedMessage:
        return await self._commit(intent, publication)

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        return await self._commit(intent, None)

    async def _commit(
        self, intent: CommitIntent, publication: OutboxPublication | None
    ) -> CommittedMessage:
        """One script for both COMMITTED steps: compact, drop the recovery
        candidate, register the expiries."""
        ck, commit_key, args = self._intent_args(intent)
        key, now = intent.key, self._clock.now_ms()
        s = self._settings
        whole = intent.identity if intent.identity.startswith(WHOLE_HEADER) else b""
        reply = await self._link.script(
            scripts.COMMIT_SCRIPT,
            [
                commit_key,
                ck.meta,
                ck.history,
                ck.expiry,
                self._keys.pointer(key.tenant, key.sender, key.cmid),
                self._keys.recovery,
            ],
            [
                *args,
                "pc" if publication is not None else "c",
                publication.stream if publication else "",
                publication.position if publication else "",
                now + s.idempotency_window_ms,
                s.idempotency_window_ms + PHYSICAL_GRACE_MS,
                now + s.history_retention_ms,
                self._keys.recovery_member(key.tenant, intent.conversation, key.sender, key.cmid),
                intent.conversation,
                as_digest(intent.identity),
                whole,
            ],
        )
        status, rest = _status(reply)
        if status == b"conflict":
            _raise_conflict(rest)
        if status != b"committed" or len(rest) != 3:
            raise StoreCorrupt("redis gave an unexpected reply")
        return CommittedMessage(
            conversation=intent.conversation,
            cmid=key.cmid,
            message_id=codec.to_str(rest[0]),
            seq=codec.to_int(rest[1]),
            server_ts_ms=codec.to_int(rest[2]),
        )

    # --- recovery and history -------------------------------------------------

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[CommitIntent]:
        if max_items <= 0:
            return []
        members = await self._link.call(
            "ZRANGE",
            self._keys.recovery,
            "-inf",
            f"({older_than_ms}",
            "BYSCORE",
            "LIMIT",
            0,
            max_items,
            write=False,
        )
        if not isinstance(members, list) or not members:
            return []
        located: list[tuple[CommitKey, str, str]] = []
        for member in members:
            try:
                tenant, conv, sender, cmid = self._keys.parse_recovery_member(codec.to_str(member))
            except ValueError as exc:
                raise StoreCorrupt("a recovery entry could not be decoded") from exc
            commit_key = self._keys.conversation(tenant, conv).commit(sender, cmid)
            located.append((CommitKey(tenant, sender, cmid), conv, commit_key))
        replies = await self._link.pipeline([("HGETALL", c) for _, _, c in located], write=False)
        found: list[CommitIntent] = []
        for (key, conv, _), reply in zip(located, replies, strict=True):
            fields = _hash_reply(reply)
            if not fields or codec.state_of(fields) is CommitState.COMMITTED:
                continue  # committed since the index was read
            found.append(codec.intent_of(fields, key, conv))
        return found

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        ck = self._keys.conversation(query.tenant, query.conversation)
        reply = await self._link.script(
            scripts.HISTORY_SCRIPT,
            [ck.meta, ck.members, ck.history, ck.expiry],
            [
                self._now(),
                query.actor,
                "b" if query.direction is Direction.BACKWARD else "f",
                query.anchor_seq,
                query.limit + 1,
            ],
        )
        status, rest = _status(reply)
        if status == b"noconv":
            raise StoreNotFound("conversation not found")
        if status == b"forbidden":
            raise StoreForbidden("reader is not a member of the conversation")
        if status != b"page" or len(rest) != 3 or not isinstance(rest[2], list):
            raise StoreCorrupt("redis gave an unexpected reply")
        candidates = (
            codec.decode_history_member(query.tenant, query.conversation, m) for m in rest[2]
        )
        return build_page(
            query,
            candidates,
            available_from_seq=codec.to_int(rest[0]),
            last_seq=codec.to_int(rest[1]),
        )

    async def readiness(self) -> None:
        await self._link.scripts_ready(scripts.ALL)

    # --- MembershipStore -----------------------------------------------------

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> Membership:
        users = frozenset(members)
        ck = self._keys.conversation(tenant, conversation)
        reply = await self._link.script(scripts.CREATE_SCRIPT, [ck.meta, ck.members], sorted(users))
        status, _ = _status(reply)
        if status == b"exists":
            raise StoreAlreadyExists("conversation already exists")
        return Membership(tenant, conversation, users, 1)

    async def add_members(self, tenant: str, conversation: str, users: Iterable[str]) -> Membership:
        return await self._change(tenant, conversation, "SADD", users)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> Membership:
        return await self._change(tenant, conversation, "SREM", users)

    async def _change(
        self, tenant: str, conversation: str, command: str, users: Iterable[str]
    ) -> Membership:
        ck = self._keys.conversation(tenant, conversation)
        reply = await self._link.script(
            scripts.CHANGE_MEMBERS_SCRIPT, [ck.meta, ck.members], [command, *sorted(set(users))]
        )
        status, rest = _status(reply)
        if status == b"noconv":
            raise StoreNotFound("conversation not found")
        return _membership(tenant, conversation, rest)

    async def membership(self, tenant: str, conversation: str) -> Membership | None:
        ck = self._keys.conversation(tenant, conversation)
        reply = await self._link.script(
            scripts.MEMBERSHIP_SCRIPT, [ck.meta, ck.members], [], write=False
        )
        status, rest = _status(reply)
        if status == b"none":
            return None
        return _membership(tenant, conversation, rest)


def _membership(tenant: str, conversation: str, rest: list[Any]) -> Membership:
    if len(rest) != 2 or not isinstance(rest[1], list):
        raise StoreCorrupt("redis gave an unexpected reply")
    members = frozenset(codec.to_str(m) for m in rest[1])
    return Membership(tenant, conversation, members, codec.to_int(rest[0]))


def _hash_reply(reply: Any) -> dict[bytes, bytes]:
    if isinstance(reply, dict):
        return {bytes(k): bytes(v) for k, v in reply.items()}
    if isinstance(reply, list):
        return codec.pairs(reply)
    raise StoreCorrupt("redis gave an unexpected reply")


def _interpret(fields: dict[bytes, bytes], key: CommitKey, conversation: str) -> LoadedCommit:
    if codec.state_of(fields) is CommitState.COMMITTED:
        return Committed(codec.committed_of(fields, conversation, key.cmid))
    return InProgress(codec.intent_of(fields, key, conversation))
