"""Bytes stored per unfinished intent and per committed message, small vs big conversations.

For each of a spread conversation (``fresh``) and a big one (``big``) the bench
reserves one new intent through the store (left unfinished), measures what
the backend holds for it, then commits it through a MessageCommitter and
measures again. With the delivery frozen by reference (DESIGN §9) both must be
the same whatever the conversation's size.

What "stored" means per backend: Redis, ``MEMORY USAGE`` of the commit hash
plus the history entry's member; Scylla, the bytes of the values of the
intent's ``commits`` row (and the history row once recorded) as the node
returns them; memory, the pickled size of what the store keeps for the key.
"""

from __future__ import annotations

import pickle
from typing import Any

from service.domain.committer import MessageCommitter, new_message_id
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    FrozenDeliveryInput,
    MessageContent,
    MessageType,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, SystemClock
from toolkit.bench.workloads import DEVICE, Population


async def measure_footprint(
    backend: Backend, population: Population, body_bytes: int
) -> dict[str, dict[str, int | None]]:
    """``{"fresh": {"intent_bytes": .., "committed_bytes": .., "members": ..}, "big": ...}``."""
    p = population
    found: dict[str, dict[str, int | None]] = {}
    targets = [("fresh", p.spread(0), p.spread_member(0, 0), p.members)]
    if p.big_conversations:
        targets.append(("big", p.big(0), p.big_member(0, 0), p.big_members))
    for label, conversation, sender, members in targets:
        send = AuthenticatedSend(
            tenant=p.tenant,
            sender=sender,
            device=DEVICE,
            conversation=conversation,
            cmid=f"footprint-{label}",
            content=MessageContent(MessageType.TEXT, b"x" * max(1, body_bytes)),
        )
        admission = await backend.membership.admission(p.tenant, conversation, sender)
        if admission is None:
            continue
        now = SystemClock().now_ms()
        reserved = await backend.store.reserve(
            send,
            FrozenDeliveryInput.at_version(admission.version),
            ReserveCandidate(new_message_id(now), now),
        )
        if not isinstance(reserved, Reserved):
            continue  # a rerun on the same tenant: already measured there
        intent_bytes = await _stored_bytes(backend, send)
        committer = MessageCommitter(
            backend.store,
            backend.membership,
            backend.outbox,
            limits=CommitLimits(sender_rate_per_s=0),
        )
        await committer.resume(send.key, conversation)
        found[label] = {
            "members": members,
            "intent_bytes": intent_bytes,
            "committed_bytes": await _stored_bytes(backend, send),
        }
    return found


async def _stored_bytes(backend: Backend, send: AuthenticatedSend) -> int | None:
    """What the backend holds for ``send``'s key, in bytes (None: not measurable)."""
    store: Any = backend.store
    if backend.name == "memory":
        stored = store.state.commits.get((send.tenant, send.sender, send.cmid))
        return None if stored is None else len(pickle.dumps(stored))
    if backend.name == "redis":
        keys = store._keys
        commit = keys.conversation(send.tenant, send.conversation).commit(send.sender, send.cmid)
        link = store._calls.link
        usage = await link.call("MEMORY", "USAGE", commit, "SAMPLES", "0", write=False)
        return int(usage) if usage is not None else None
    cql = getattr(store, "cql", None)
    if cql is None:
        return None
    rows = await cql.simple(
        "SELECT * FROM {ks}.commits WHERE tenant = %s AND sender = %s AND cmid = %s",
        (send.tenant, send.sender, send.cmid),
    )
    return sum(_value_bytes(v) for row in rows for v in row.values()) if rows else None


def _value_bytes(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    if isinstance(value, list | tuple | set | frozenset):
        return 4 + sum(4 + _value_bytes(v) for v in value)
    return len(str(value))
