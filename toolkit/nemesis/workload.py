"""Clients of the nemesis: concurrent commits over real gRPC, every call in the history.

Each client loops until told to stop: it picks a conversation and sends a new
message (most sends), the very same request as one already ACKed (a replay: the
identical ACK is due), another request with an ACKed key (a conflict, which must be
refused: other content in the same conversation, or the same content in another
conversation), a new message from a sender who is not a member (refused as such), or
reads a conversation's whole history (paged) while the faults go on. A call is retried
with the same request on UNAVAILABLE or a deadline, moving to the next replica, as a
gateway would, a bounded number of times; then its outcome is recorded as unknown,
as is any other code of ``outcomes.UNKNOWN_OUTCOME``; every other status is a
definite refusal, which the checkers hold to ``outcomes``. After the schedule,
``settle`` drives RecoverDue until nothing is left (bounded), reads every
conversation's whole history (the final read) and probes each key whose outcome
stayed unknown with ResumeExisting.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field, replace

from grpc import aio

from service.api import convert, errors
from service.client import NO_RETRY, CommitClient
from service.domain.errors import IdempotencyConflict
from service.domain.model import (
    AuthenticatedSend,
    Direction,
    HistoryQuery,
    MessageContent,
    MessageType,
)
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc
from toolkit.nemesis.history import HistoryWriter, Record, request_digest, send_digest
from toolkit.nemesis.outcomes import RETRYABLE, UNKNOWN_OUTCOME

ATTEMPT_TIMEOUT_S = 4.0
MAX_ATTEMPTS = 6
CALL_DEADLINE_S = 15.0
SENDERS = ("alice", "bob", "carol")
NON_MEMBER = "mallory"
"""A sender in no conversation: every send of theirs must be refused NOT_A_MEMBER."""
REPLAYS, CONFLICTS, NON_MEMBERS, READS = 0.10, 0.06, 0.02, 0.04
"""Shares of the calls (the rest are fresh sends)."""
RECOVER_ROUNDS = 30
PAGE = 200
MAX_PAGES = 1000


@dataclass
class Workload:
    """Shared by the clients of one schedule."""

    tenant: str
    conversations: list[str]
    targets: list[str]
    history: HistoryWriter
    rng: random.Random
    sent: list[AuthenticatedSend] = field(default_factory=list)
    acked: list[AuthenticatedSend] = field(default_factory=list)
    """Fresh sends that were ACKed: the ones replays and conflicts reuse."""
    counts: dict[str, int] = field(default_factory=dict)
    stubs: list[committer_pb2_grpc.MessageCommitterServiceStub] = field(default_factory=list)
    channels: list[aio.Channel] = field(default_factory=list)

    def open(self) -> None:
        for target in self.targets:
            channel = aio.insecure_channel(target)
            self.channels.append(channel)
            self.stubs.append(committer_pb2_grpc.MessageCommitterServiceStub(channel))

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # --- sending -------------------------------------------------------------

    def _next_send(self, client: int, serial: int) -> tuple[AuthenticatedSend, bool]:
        """The next send, and whether it is a fresh one (a key never used before)."""
        rng = self.rng
        roll = rng.random()
        if self.acked and roll < REPLAYS:
            self.count("replays")
            return rng.choice(self.acked), False
        if self.acked and roll < REPLAYS + CONFLICTS:
            old = rng.choice(self.acked)
            self.count("conflicts")
            others = [c for c in self.conversations if c != old.conversation]
            if others and rng.random() < 0.5:  # the same content in another conversation
                return replace(old, conversation=rng.choice(others)), False
            body = old.content.body + b" (edited)"
            return replace(old, content=MessageContent(MessageType.TEXT, body=body)), False
        non_member = roll < REPLAYS + CONFLICTS + NON_MEMBERS
        send = AuthenticatedSend(
            tenant=self.tenant,
            sender=NON_MEMBER if non_member else rng.choice(SENDERS),
            device=f"d{client}",
            conversation=rng.choice(self.conversations),
            cmid=f"c{client}-{serial}",
            content=MessageContent(MessageType.TEXT, body=f"message {client}-{serial}".encode()),
        )
        if non_member:
            self.count("non-member sends")
            return send, False
        self.sent.append(send)
        self.count("fresh")
        return send, True

    async def client(self, index: int, stop: asyncio.Event) -> None:
        serial = 0
        while not stop.is_set():
            serial += 1
            if self.rng.random() < READS:
                conversation = self.rng.choice(self.conversations)
                await self.read(index, self.stubs[index % len(self.stubs)], conversation)
                continue
            send, fresh = self._next_send(index, serial)
            await self.commit(index, send, index, fresh)

    async def commit(
        self, process: int, send: AuthenticatedSend, first: int, fresh: bool = False
    ) -> None:
        op = self.history.invoke(
            process, "commit", send.tenant, send.conversation,
            sender=send.sender, cmid=send.cmid, digest=send_digest(send),
        )  # fmt: skip
        request = pb.CommitRequest(send=convert.send_to_proto(send))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_DEADLINE_S
        reason = "no attempt"
        for attempt in range(MAX_ATTEMPTS):
            stub = self.stubs[(first + attempt) % len(self.stubs)]
            timeout = min(ATTEMPT_TIMEOUT_S, deadline - loop.time())
            if timeout <= 0:
                break
            try:
                response: pb.CommitResponse = await stub.Commit(request, timeout=timeout)  # type: ignore[misc]
            except aio.AioRpcError as err:
                detail = errors.parse_details(list(err.trailing_metadata() or ()))
                code = err.code().name
                reason = f"{code} {detail.reason}".strip()
                if code not in RETRYABLE:
                    if code in UNKNOWN_OUTCOME:
                        self.history.unknown(op, reason)  # may have written part-way
                    else:
                        self.history.error(op, code, detail.reason)
                    self.count(f"error {code}")
                    return
                self.count("retries")
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            msg = response.message
            self.history.ok(op, msg.seq, msg.message_id, msg.server_ts_ms)
            self.count("acks")
            if fresh:
                self.acked.append(send)
            return
        self.history.unknown(op, reason)
        self.count("unknown")

    # --- after the schedule --------------------------------------------------

    async def settle(self) -> dict[str, int]:
        """Recover, read every history, probe unknown keys; figures of what was done."""
        client = CommitClient(self.channels[0], NO_RETRY)
        recovered = 0
        for _ in range(RECOVER_ROUNDS):
            try:
                report = await client.recover_due(0, 500)
            except Exception:
                await asyncio.sleep(1.0)
                continue
            recovered += report.committed
            if report.scanned == 0 or report.committed == 0:
                break  # nothing due, or nothing more finishes (failing ones are queued)
        for conversation in self.conversations:
            await self.read(0, self.stubs[0], conversation)
        probes = 0
        for send in {s.key: s for s in self.sent}.values():
            probes += await self._probe(client, send)
        return {"recovered": recovered, "probes": probes}

    async def read(
        self,
        process: int,
        stub: committer_pb2_grpc.MessageCommitterServiceStub,
        conversation: str,
    ) -> None:
        """Read ``conversation``'s whole history (forward, paged) into the history."""
        op = self.history.invoke(process, "read", self.tenant, conversation)
        self.count("reads")
        records: list[Record] = []
        anchor, last_seq = 0, 0
        try:
            for _ in range(MAX_PAGES):
                query = HistoryQuery(self.tenant, conversation, SENDERS[0], Direction.FORWARD,
                                     anchor, PAGE)  # fmt: skip
                request = convert.history_query_to_proto(query)
                response = await stub.History(request, timeout=ATTEMPT_TIMEOUT_S)  # type: ignore[misc]
                page = convert.page_from_proto(response.page)
                last_seq = page.last_seq
                for r in page.records:
                    digest = request_digest(
                        tenant=r.tenant, sender=r.sender, device=r.device,
                        conversation=r.conversation, cmid=r.cmid, content=r.content,
                        mentions=r.mentions, reply_to=r.reply_to,
                    )  # fmt: skip
                    records.append(
                        Record(r.seq, r.message_id, r.sender, r.cmid, digest, r.server_ts_ms)
                    )
                anchor = page.next_anchor
                if anchor == 0:
                    break
        except aio.AioRpcError as err:
            code = err.code().name
            detail = errors.parse_details(list(err.trailing_metadata() or ()))
            if code in UNKNOWN_OUTCOME:
                self.history.unknown(op, f"{code} {detail.reason}".strip())
            else:  # a member's read has no reason to be refused: the checker says so
                self.history.error(op, code, detail.reason)
            return
        self.history.read_ok(op, records, last_seq)

    async def _probe(self, client: CommitClient, send: AuthenticatedSend) -> int:
        op = self.history.invoke(
            0, "resume", send.tenant, send.conversation,
            sender=send.sender, cmid=send.cmid, digest=send_digest(send),
        )  # fmt: skip
        try:
            found = await client.resume_existing(send)
        except IdempotencyConflict:  # another request holds the key (it won a race)
            self.history.error(op, "ALREADY_EXISTS", "IDEMPOTENCY_CONFLICT")
            return 1
        except Exception as exc:
            self.history.unknown(op, type(exc).__name__)
            return 1
        if found is None:
            self.history.not_found(op)
        else:
            self.history.ok(op, found.seq, found.message_id, found.server_ts_ms)
        return 1
