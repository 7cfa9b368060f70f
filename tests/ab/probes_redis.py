"""Probes 1-4 of the A/B: bad data and bad timing on a real Redis.

Each probe starts its own redis-server and ``serve`` processes of one tree,
drives them from outside and returns an Outcome: ``held`` is True when the
promise of issue 11 holds on that tree. An unfinished intent is made the way
a crash would leave it, from outside: the service's Redis user loses XADD, so
a commit stops after its record (RECORDED) and answers UNAVAILABLE.
"""

from __future__ import annotations

import base64
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from tests.ab.parts import (
    Outcome,
    ProbeError,
    RedisServer,
    Serve,
    Tree,
    commit_of,
    outbox_entries,
    setup_redis,
    unfinished,
)
from tests.ab.rpc import (
    Reply,
    ack,
    commit,
    create_conversation,
    health,
    history_seqs,
    recover_due,
    resume,
    send,
)

TENANT = "ab"
QUIET = ["--recovery-interval", "1h"]  # no recovery behind the probe's back
FAST_CLOCK = "+3d"


def _serve(tree: Tree, redis: RedisServer, work: Path, name: str, *args: str) -> Serve:
    return Serve(tree, ["--backend", "redis", *args], {"MC_REDIS_URL": redis.url},
                 log_path=work / f"{name}.log")  # fmt: skip


def _conversation(target: str, conversation: str = "c1") -> None:
    created = create_conversation(target, TENANT, conversation, "alice", "bob")
    if not created.ok:
        raise ProbeError(f"CreateConversation failed: {created}")


def _leave_unfinished(redis: RedisServer, target: str, cmids: list[str], parallel: int = 1) -> None:
    """Commit each cmid with XADD refused: each stops RECORDED, answered UNAVAILABLE."""
    redis.deny("xadd")
    try:

        def one(cmid: str) -> None:
            reply = commit(target, send(TENANT, "c1", cmid, f"body of {cmid}"))
            if reply.ok or reply.code != "UNAVAILABLE":
                raise ProbeError(f"a commit with XADD refused answered {reply}")

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, cmids))
    finally:
        redis.allow("xadd")


def _rewrite_record(redis: RedisServer, cmid: str, **changes: object) -> None:
    key, fields = commit_of(redis.admin, cmid)
    record = json.loads(fields[b"r"])
    record.update(changes)
    redis.admin.hset(key, "r", json.dumps(record, separators=(",", ":")))


# --- 1. a poison intent ------------------------------------------------------------


def poison_intent(tree: Tree, work: Path) -> Outcome:
    """An undecodable unfinished intent, oldest in the recovery index: readiness
    must stay SERVING and RecoverDue must still finish the others."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        server = _serve(tree, redis, work, "serve", "--readiness-interval", "300ms", *QUIET)
        with server:
            _conversation(server.target)
            _leave_unfinished(redis, server.target, ["poison-1"])
            time.sleep(0.05)  # the poison is the oldest by a clear margin
            _leave_unfinished(redis, server.target, ["fine-1", "fine-2"])
            _rewrite_record(redis, "poison-1", y="hologram")  # a type a newer release may write
            seen = set()
            for _ in range(8):  # about six readiness intervals
                time.sleep(0.25)
                seen.add(health(server.target))
            recovered = recover_due(server.target)
            others_done = 3 - unfinished(redis.admin)  # the poison itself never finishes
            final = health(server.target)
    held = seen == {"SERVING"} and recovered.ok and others_done == 2 and final == "SERVING"
    counts = " ".join(f"{k}={v}" for k, v in sorted(recovered.data.items()))
    answer = f"OK ({counts})" if recovered.ok else str(recovered)
    return Outcome(held, f"health {'/'.join(sorted(seen))}; RecoverDue {answer};"
                         f" the 2 others committed: {others_done}")  # fmt: skip


# --- 2. a fast clock ---------------------------------------------------------------


def clock_ahead_s(server: Serve) -> float:
    """How far ahead the log's first timestamp is of now (the faketime check)."""
    match = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", server.log(), re.MULTILINE)
    if match is None:
        raise ProbeError("the fast replica's log has no timestamp")
    return datetime.fromisoformat(match.group(1)).timestamp() - time.time()


def fast_clock_redis(tree: Tree, work: Path) -> Outcome:
    """Commit through a right replica, retry through one whose clock runs three days
    ahead (libfaketime), on the same Redis: the retry must replay the first ACK."""
    window = ["--idempotency-window", "2d", *QUIET]  # shorter than the skew
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        right = _serve(tree, redis, work, "right", *window)
        ahead = _serve(tree, redis, work, "ahead", *window)
        ahead.wrapper = ["faketime", "-f", FAST_CLOCK]
        ahead.env = {**ahead.env, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        with right, ahead:
            if clock_ahead_s(ahead) < 2.5 * 86400:
                raise ProbeError("faketime did not move the replica's clock")
            _conversation(right.target)
            request = send(TENANT, "c1", "clock-1", "first")
            first = commit(right.target, request)
            retry = commit(ahead.target, request)
            again = commit(right.target, request)
    if not first.ok:
        raise ProbeError(f"the first commit failed: {first}")
    same = retry.ok and ack(retry) == ack(first) and again.ok and ack(again) == ack(first)
    return Outcome(
        same,
        f"first seq={ack(first)[0]}; retry via {FAST_CLOCK} replica "
        f"{ack_text(retry, first)}; right replica then {ack_text(again, first)}",
    )


def ack_text(reply: Reply, first: Reply) -> str:
    if not reply.ok:
        return f"answered {reply}"
    seq, mid = ack(reply)
    return f"seq={seq} ({'same' if (seq, mid) == ack(first) else 'different'} ACK)"


# --- 3. retention against an unfinished commit ---------------------------------------


def retention_vs_unfinished(tree: Tree, work: Path) -> Outcome:
    """An intent left RECORDED while retention passes a higher seq of its
    conversation: resuming it must commit the original record."""
    short = ["--idempotency-window", "2s", "--history-retention", "2s", *QUIET]
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        with _serve(tree, redis, work, "serve", *short) as server:
            _conversation(server.target)
            _leave_unfinished(redis, server.target, ["kept-1"])
            _, fields = commit_of(redis.admin, "kept-1")
            seq, message_id = int(fields[b"s"]), fields[b"m"].decode()
            if not commit(server.target, send(TENANT, "c1", "later-2", "later")).ok:
                raise ProbeError("a later commit failed")
            time.sleep(3.0)  # retention passes seq 2 (committed); seq 1 is unfinished
            if not commit(server.target, send(TENANT, "c1", "later-3", "later still")).ok:
                raise ProbeError("a commit after retention failed")
            before = history_seqs(server.target, TENANT, "c1")  # a read sweeps as well
            resumed = resume(server.target, TENANT, "c1", "kept-1")
            after = history_seqs(server.target, TENANT, "c1")
            published = outbox_entries(redis.admin, message_id)
    held = resumed.ok and ack(resumed) == (seq, message_id) and seq in after
    outcome = f"ACK seq={ack(resumed)[0]} original" if held else f"{resumed}"
    return Outcome(held, f"history before resume {before}; resume of seq {seq}: {outcome};"
                         f" history after {after}; outbox entries of it {published}")  # fmt: skip


# --- 4. recovery behind its own failures ------------------------------------------------

_RUN_LINE = re.compile(r"recovery: (?:scanned \d+, committed (\d+)|(\d+) unfinished intents)")
STALL_INTENTS = 150


def recovery_stalls(tree: Tree, work: Path) -> Outcome:
    """150 unfinished intents, the oldest failing every attempt (its record no longer
    matches history): one recovery run must still finish the other 149."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        with _serve(tree, redis, work, "plant", *QUIET) as planter:
            _conversation(planter.target)
            _leave_unfinished(redis, planter.target, ["stall-000"])
            time.sleep(0.05)
            rest = [f"stall-{i:03d}" for i in range(1, STALL_INTENTS)]
            _leave_unfinished(redis, planter.target, rest, parallel=4)
        tampered = base64.b64encode(b"not what history holds").decode("ascii")
        _rewrite_record(redis, "stall-000", b=tampered)
        if unfinished(redis.admin) != STALL_INTENTS:
            raise ProbeError("the unfinished intents were not all planted")
        loop = ["--recovery-interval", "5s", "--recovery-grace", "0s", "--recovery-batch", "100"]
        with _serve(tree, redis, work, "recover", *loop) as server:
            deadline = time.monotonic() + 20
            match = _RUN_LINE.search(server.log())
            while match is None and time.monotonic() < deadline:
                time.sleep(0.1)
                match = _RUN_LINE.search(server.log())
            left = unfinished(redis.admin)  # before the next run (>= 4 s later)
    if match is None:
        raise ProbeError("no recovery run was logged within 20 s")
    first_run = int(match.group(1) or match.group(2))
    done = STALL_INTENTS - left
    held = first_run == STALL_INTENTS - 1 and done == STALL_INTENTS - 1
    return Outcome(
        held,
        f"first recovery run (batch 100) committed {first_run} of "
        f"{STALL_INTENTS - 1} recoverable; unfinished after it {left}",
    )
