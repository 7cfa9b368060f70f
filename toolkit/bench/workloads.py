"""The workloads and the exact requests they send.

Every request is serialised once, here, and sent as bytes; a client process
parses only the responses it has to check. All ids come from one
``Population`` (one tenant per run, so runs never collide in a shared
backend):

* spread conversations ``s<i>`` with members ``s<i>.u<j>``;
* one hot conversation ``hot`` with members ``hot.u<j>``;
* big conversations ``b<i>`` with ``big_members`` members ``b<i>.u<j>``
  (100,000 by default), created with the first 10,000 and grown by AddMembers
  pages of 10,000, as a client of the API would.

A sender rotates over a conversation's members, so the per-sender quota
(50/s, burst 200 by default) is not what a workload measures.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from grpc_health.v1 import health_pb2

from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2 as mpb

COMMIT = "/message_committer.v1.MessageCommitterService/Commit"
HISTORY = "/message_committer.v1.MessageCommitterService/History"
CREATE_CONVERSATION = "/message_committer.v1.ConversationMembershipService/CreateConversation"
ADD_MEMBERS = "/message_committer.v1.ConversationMembershipService/AddMembers"
MEMBER_PAGE = 10_000
"""Users per CreateConversation/AddMembers call (the API's limit)."""
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
DEVICE = "d1"
POOL_CAP = 50_000
"""Committed sends each client process keeps for replays and conflicts."""


class Kind(enum.StrEnum):
    """What one workload sends."""

    GRPC_FLOOR = "grpc-floor"
    FRESH = "fresh"
    REPLAY = "replay"
    DUPMIX = "dupmix"
    CONFLICT = "conflict"
    HOT = "hot"
    BIG = "big"
    HISTORY = "history"


DESCRIPTIONS: dict[Kind, str] = {
    Kind.GRPC_FLOOR: "grpc.health.v1 Health/Check on the same server (interceptor included)",
    Kind.FRESH: "new sends, each to a random one of the spread conversations",
    Kind.REPLAY: "exact replays of keys committed by 'fresh' (ACK must be identical)",
    Kind.DUPMIX: "duplicate-heavy mix: replays of committed keys, the rest fresh",
    Kind.CONFLICT: "conflict mix: committed keys reused with other content, the rest fresh",
    Kind.HOT: "new sends, all to one conversation",
    Kind.BIG: "new sends to the big conversations (100,000 members each by default)",
    Kind.HISTORY: "history pages of the hot conversation, newest to oldest, over and over",
}
COMMIT_KINDS = frozenset({Kind.FRESH, Kind.REPLAY, Kind.DUPMIX, Kind.CONFLICT, Kind.HOT, Kind.BIG})


@dataclass(frozen=True, slots=True)
class Population:
    """The tenant, conversations and members one run uses."""

    tenant: str
    spread_conversations: int = 1000
    members: int = 4
    hot_members: int = 64
    big_conversations: int = 2
    big_members: int = 100_000

    def spread(self, index: int) -> str:
        return f"s{index}"

    def spread_member(self, index: int, member: int) -> str:
        return f"s{index}.u{member}"

    hot = "hot"

    def hot_member(self, member: int) -> str:
        return f"hot.u{member}"

    def big(self, index: int) -> str:
        return f"b{index}"

    def big_member(self, index: int, member: int) -> str:
        return f"b{index}.u{member}"

    def big_members_of(self, index: int) -> list[str]:
        return [self.big_member(index, j) for j in range(self.big_members)]

    def create_requests(self) -> Iterator[bytes]:
        """CreateConversation requests for every conversation, hot first; a big one
        with its first page of members."""
        hot = [self.hot_member(j) for j in range(self.hot_members)]
        yield _create(self.tenant, self.hot, hot)
        for i in range(self.spread_conversations):
            members = [self.spread_member(i, j) for j in range(self.members)]
            yield _create(self.tenant, self.spread(i), members)
        for i in range(self.big_conversations):
            yield _create(self.tenant, self.big(i), self.big_members_of(i)[:MEMBER_PAGE])

    def add_requests(self) -> list[list[bytes]]:
        """Per big conversation, the AddMembers pages growing it to ``big_members``."""
        pages = []
        for i in range(self.big_conversations):
            everyone = self.big_members_of(i)
            pages.append(
                [
                    mpb.AddMembersRequest(
                        tenant=self.tenant,
                        conversation=self.big(i),
                        members=everyone[start : start + MEMBER_PAGE],
                    ).SerializeToString()
                    for start in range(MEMBER_PAGE, len(everyone), MEMBER_PAGE)
                ]
            )
        return pages


def _create(tenant: str, conversation: str, members: list[str]) -> bytes:
    request = mpb.CreateConversationRequest(
        tenant=tenant, conversation=conversation, members=members
    )
    return request.SerializeToString()


@dataclass(frozen=True, slots=True)
class Job:
    """One workload's share for one client process."""

    kind: Kind
    target: str
    population: Population
    streams: int
    max_calls: int
    start_at: float
    """Wall-clock time (``time.time()``) all client processes start at."""
    duration_s: float
    timeout_s: float = 10.0
    body_bytes: int = 100
    ratio: float = 0.9
    """Replay share of dupmix, conflicting share of conflict."""
    page_size: int = 50
    seed: int = 0


@dataclass(slots=True)
class Call:
    """One RPC: method, serialised request, the outcome expected, a response check."""

    method: str
    request: bytes
    expect_ok: bool = True
    """False when the call must fail with ALREADY_EXISTS (a conflicting reuse)."""
    check: Callable[[bytes], bool] | None = None
    """Called with an OK response; False means a wrong answer."""


@dataclass(frozen=True, slots=True)
class _Sent:
    request: bytes
    sender: str
    conversation: str
    cmid: str
    message_id: str


@dataclass
class Sends:
    """Makes the Commit requests of one client process and remembers what committed."""

    population: Population
    worker: int
    body_bytes: int
    rng: random.Random
    pool: list[_Sent] = field(default_factory=list)
    _counter: int = 0
    _body: bytes = b""
    _other_body: bytes = b""

    def __post_init__(self) -> None:
        alphabet = b"abcdefghijklmnopqrstuvwxyz "
        self._body = bytes(self.rng.choice(alphabet) for _ in range(max(1, self.body_bytes)))
        self._other_body = b"#" + self._body[1:]

    def _send(self, conversation: str, sender: str, cmid: str, body: bytes) -> bytes:
        send = pb.AuthenticatedSend(
            tenant=self.population.tenant,
            sender=sender,
            device=DEVICE,
            conversation=conversation,
            client_message_id=cmid,
            content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=body),
        )
        return pb.CommitRequest(send=send).SerializeToString()

    def fresh(self, conversation: str, sender: str) -> Call:
        self._counter += 1
        cmid = f"w{self.worker}.{self._counter}"
        request = self._send(conversation, sender, cmid, self._body)

        def check(response: bytes) -> bool:
            message = pb.CommitResponse.FromString(response).message
            self._remember(_Sent(request, sender, conversation, cmid, message.message_id))
            return (
                message.client_message_id == cmid
                and message.conversation == conversation
                and message.seq > 0
            )

        return Call(COMMIT, request, check=check)

    def fresh_spread(self) -> Call:
        p = self.population
        index = self.rng.randrange(p.spread_conversations)
        return self.fresh(p.spread(index), p.spread_member(index, self.rng.randrange(p.members)))

    def fresh_hot(self) -> Call:
        p = self.population
        return self.fresh(p.hot, p.hot_member(self.rng.randrange(p.hot_members)))

    def fresh_big(self) -> Call:
        p = self.population
        index = self.rng.randrange(max(1, p.big_conversations))
        return self.fresh(p.big(index), p.big_member(index, self.rng.randrange(p.big_members)))

    def _remember(self, sent: _Sent) -> None:
        if len(self.pool) < POOL_CAP:
            self.pool.append(sent)
        else:
            self.pool[self.rng.randrange(POOL_CAP)] = sent

    def replay(self) -> Call:
        if not self.pool:
            return self.fresh_spread()  # nothing committed yet: the coordinator prevents this
        sent = self.rng.choice(self.pool)

        def check(response: bytes) -> bool:
            message = pb.CommitResponse.FromString(response).message
            return message.message_id == sent.message_id

        return Call(COMMIT, sent.request, check=check)

    def conflict(self) -> Call:
        if not self.pool:
            return self.fresh_spread()
        sent = self.rng.choice(self.pool)
        request = self._send(sent.conversation, sent.sender, sent.cmid, self._other_body)
        return Call(COMMIT, request, expect_ok=False)


class Plan:
    """The calls of one stream of one workload."""

    def __init__(self, job: Job, sends: Sends, stream: int) -> None:
        self._job = job
        self._sends = sends
        self._rng = sends.rng
        self._stream = stream
        self._anchor = 0
        self._health = health_pb2.HealthCheckRequest(service="").SerializeToString()

    def next_call(self) -> Call:
        kind, s = self._job.kind, self._sends
        if kind is Kind.FRESH:
            return s.fresh_spread()
        if kind is Kind.HOT:
            return s.fresh_hot()
        if kind is Kind.BIG:
            return s.fresh_big()
        if kind is Kind.REPLAY:
            return s.replay()
        if kind is Kind.DUPMIX:
            return s.replay() if self._rng.random() < self._job.ratio else s.fresh_spread()
        if kind is Kind.CONFLICT:
            return s.conflict() if self._rng.random() < self._job.ratio else s.fresh_spread()
        if kind is Kind.HISTORY:
            return self._history()
        return Call(HEALTH_CHECK, self._health)

    def _history(self) -> Call:
        p = self._job.population
        request = pb.HistoryRequest(
            tenant=p.tenant,
            conversation=p.hot,
            actor=p.hot_member(self._stream % p.hot_members),
            direction=pb.DIRECTION_BACKWARD,
            anchor_seq=self._anchor,
            limit=self._job.page_size,
        ).SerializeToString()

        def check(response: bytes) -> bool:
            page = pb.HistoryResponse.FromString(response).page
            self._anchor = page.next_anchor
            return bool(page.records) or page.next_anchor == 0

        return Call(HISTORY, request, check=check)
