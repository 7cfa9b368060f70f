"""The nemesis history: one JSON line per invocation and per completion (JSONL).

Lines (every line has ``type``, ``wall_ms`` and ``mono_ns``; ``op`` ids are unique):

* ``{"type": "invoke", "op", "process", "kind": "commit" | "resume", "tenant",
  "conversation", "sender", "cmid", "digest"}``: a client sends a commit (or, after
  recovery, probes a key with ResumeExisting); ``digest`` is ``request_digest`` of the
  request, so a record read back can be compared with what was sent.
* ``{"type": "invoke", "op", "process", "kind": "read", "tenant", "conversation"}``:
  a full-history read of one conversation (paged, forward), during the run and, the
  last one, after heal and recovery.
* ``{"type": "invoke", "op", "process": 0, "kind": "create", "tenant", "conversation",
  "members": [...]}``: the conversation's creation (before the load; the members never
  change during a run), so the checkers know who may send.
* ``{"type": "complete", "op", "outcome": "ok", "seq", "message_id", "server_ts_ms"}``
  (a commit's or resume's ACK), ``{"outcome": "ok", "records": [...], "last_seq"}``
  (a read; each record has seq, message_id, sender, cmid, digest, server_ts_ms;
  ``last_seq`` is the last page's), ``{"outcome": "error", "code", "reason"}`` (a
  definite refusal: nothing was written for this request), ``{"outcome": "unknown",
  "reason"}`` (a status of ``outcomes.UNKNOWN_OUTCOME``, after the last retry for the
  retryable ones: it may take effect later) or ``{"outcome": "not_found"}`` (a resume
  of a key that was never reserved).
* ``{"type": "fault", "name", "target", "phase": "start" | "failed" | "end"}``: what the nemesis
  did; ``{"type": "fault", ..., "phase": "proven" | "no-effect", "evidence"}``: what it then
  observed of the fault's effect (``proof.py``); checkers ignore these lines.

Times: ``mono_ns`` is ``time.monotonic_ns()`` of the one process writing the history
(all clients run in it), which is what real-time order is judged by.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from service.domain.model import AuthenticatedSend, MessageContent

Kind = Literal["commit", "resume", "read", "create"]
Outcome = Literal["ok", "error", "unknown", "not_found"]


def _content_fields(content: MessageContent) -> list[object]:
    ref = content.body_ref
    return [
        content.message_type.value,
        content.custom_type,
        content.body.hex(),
        [ref.uri, ref.size_bytes, ref.sha256] if ref is not None else None,
    ]


def request_digest(
    *,
    tenant: str,
    sender: str,
    device: str,
    conversation: str,
    cmid: str,
    content: MessageContent,
    mentions: Iterable[str],
    reply_to: str,
) -> str:
    """A digest of everything that makes two sends the same send (hex SHA-256)."""
    fields = [tenant, sender, device, conversation, cmid, *_content_fields(content)]
    canonical = json.dumps([*fields, sorted(mentions), reply_to], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def send_digest(send: AuthenticatedSend) -> str:
    return request_digest(
        tenant=send.tenant,
        sender=send.sender,
        device=send.device,
        conversation=send.conversation,
        cmid=send.cmid,
        content=send.content,
        mentions=send.mentions,
        reply_to=send.reply_to,
    )


@dataclass(frozen=True, slots=True)
class Record:
    """One history record as read back."""

    seq: int
    message_id: str
    sender: str
    cmid: str
    digest: str
    server_ts_ms: int


@dataclass(slots=True)
class Completion:
    outcome: Outcome
    mono_ns: int
    seq: int = 0
    message_id: str = ""
    server_ts_ms: int = 0
    code: str = ""
    reason: str = ""
    records: tuple[Record, ...] = ()
    last_seq: int = 0


@dataclass(slots=True)
class Op:
    """One invocation and (when it returned) its completion."""

    op: int
    process: int
    kind: Kind
    tenant: str
    conversation: str
    mono_ns: int
    sender: str = ""
    cmid: str = ""
    digest: str = ""
    done: Completion | None = None
    members: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.tenant, self.sender, self.cmid)

    @property
    def acked(self) -> bool:
        return self.done is not None and self.done.outcome == "ok"


@dataclass
class HistoryWriter:
    """Appends history lines to a file, one flushed line per event (thread-safe)."""

    path: Path
    _file: IO[str] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _next: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, line: dict[str, Any]) -> None:
        line["wall_ms"] = time.time_ns() // 1_000_000
        line["mono_ns"] = time.monotonic_ns()
        text = json.dumps(line, separators=(",", ":"))
        with self._lock:
            self._file.write(text + "\n")
            self._file.flush()

    def invoke(self, process: int, kind: Kind, tenant: str, conversation: str, **key: str) -> int:
        """Record an invocation; returns its op id. ``key``: sender, cmid, digest."""
        with self._lock:
            self._next += 1
            op = self._next
        line: dict[str, Any] = {"type": "invoke", "op": op, "process": process, "kind": kind}
        self._write({**line, "tenant": tenant, "conversation": conversation, **key})
        return op

    def create(self, tenant: str, conversation: str, members: Iterable[str]) -> int:
        """Record a conversation's creation with its members; returns its op id."""
        with self._lock:
            self._next += 1
            op = self._next
        line = {"type": "invoke", "op": op, "process": 0, "kind": "create", "tenant": tenant}
        self._write({**line, "conversation": conversation, "members": list(members)})
        return op

    def ok(self, op: int, seq: int, message_id: str, server_ts_ms: int) -> None:
        self._write(
            {"type": "complete", "op": op, "outcome": "ok", "seq": seq,
             "message_id": message_id, "server_ts_ms": server_ts_ms}
        )  # fmt: skip

    def read_ok(self, op: int, records: Iterable[Record], last_seq: int) -> None:
        rows = [
            {"seq": r.seq, "message_id": r.message_id, "sender": r.sender, "cmid": r.cmid,
             "digest": r.digest, "server_ts_ms": r.server_ts_ms}
            for r in records
        ]  # fmt: skip
        line = {"type": "complete", "op": op, "outcome": "ok", "records": rows}
        self._write({**line, "last_seq": last_seq})

    def error(self, op: int, code: str, reason: str) -> None:
        self._write({"type": "complete", "op": op, "outcome": "error", "code": code,
                     "reason": reason})  # fmt: skip

    def unknown(self, op: int, reason: str) -> None:
        self._write({"type": "complete", "op": op, "outcome": "unknown", "reason": reason})

    def not_found(self, op: int) -> None:
        self._write({"type": "complete", "op": op, "outcome": "not_found"})

    def fault(
        self,
        name: str,
        target: str,
        phase: Literal["start", "failed", "end", "proven", "no-effect"],
        evidence: str = "",
    ) -> None:
        line = {"type": "fault", "name": name, "target": target, "phase": phase}
        self._write({**line, "evidence": evidence} if evidence else line)

    def close(self) -> None:
        self._file.close()


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def load(lines: Iterable[dict[str, Any]]) -> list[Op]:
    """Pair invocations with completions; ops in invocation order."""
    ops: dict[int, Op] = {}
    for line in lines:
        if line["type"] == "invoke":
            ops[line["op"]] = Op(
                op=line["op"],
                process=line.get("process", 0),
                kind=line["kind"],
                tenant=line["tenant"],
                conversation=line["conversation"],
                mono_ns=line["mono_ns"],
                sender=line.get("sender", ""),
                cmid=line.get("cmid", ""),
                digest=line.get("digest", ""),
                members=tuple(line.get("members", ())),
            )
        elif line["type"] == "complete":
            ops[line["op"]].done = Completion(
                outcome=line["outcome"],
                mono_ns=line["mono_ns"],
                seq=line.get("seq", 0),
                message_id=line.get("message_id", ""),
                server_ts_ms=line.get("server_ts_ms", 0),
                code=line.get("code", ""),
                reason=line.get("reason", ""),
                records=tuple(Record(**r) for r in line.get("records", ())),
                last_seq=line.get("last_seq", 0),
            )
    return list(ops.values())


def load_file(path: Path) -> list[Op]:
    return load(read_lines(path))


def fault_counts(path: Path) -> dict[str, int]:
    """How often each fault kind began, from the history's fault lines (a start whose
    target then reported "failed" did not begin)."""
    counts: dict[str, int] = {}
    for line in read_lines(path):
        if line["type"] == "fault" and line["phase"] in ("start", "failed"):
            step = 1 if line["phase"] == "start" else -1
            counts[line["name"]] = counts.get(line["name"], 0) + step
    return {name: n for name, n in counts.items() if n > 0}
