"""Which answers each operation may end with, in which situation: the one table.

The workload records a status by this table (an unknown-outcome code is an
``unknown`` completion, any other non-OK status a definite ``error``); the
project's checker (``checker.py``) flags every answer the table does not allow
for the situation the history shows; porcupine gets the refusal classes as JSON
(``go_table``) and its model (``porcupine/model.go``) allows each class only in
its situation. The codes and reasons are the server's (``service/api/errors.py``).

Situations of a commit, decided from the history (the key's holder is the request
that the final reads show under the key, in any conversation of the tenant; keys
are tenant-wide):

* ``fresh``: nothing holds the key, or this very request does, and the sender is a
  member: OK (a new ACK, or the same ACK as every other call of this request);
* ``replay``: this request was ACKed before this call began: OK with the identical
  ACK only (checked by ``ack-mismatch``), never a refusal;
* ``conflict``: another request holds the key (other content, or another
  conversation) and was sent before this call returned: ALREADY_EXISTS /
  IDEMPOTENCY_CONFLICT, never OK;
* ``non-member``: the sender is not a member and no other request holds the key:
  PERMISSION_DENIED / NOT_A_MEMBER, never OK.

In every situation an unknown-outcome code is allowed too (it promises nothing). A
read by a member may end OK or with an unknown-outcome code only.
"""

from __future__ import annotations

import json
from typing import Literal

Situation = Literal["fresh", "replay", "conflict", "non-member"]
Answer = Literal["ok", "conflict", "not-member", "refused"]

UNKNOWN_OUTCOME: frozenset[str] = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED", "UNKNOWN"}
)
"""Codes after which the request may still take effect (a gateway would retry)."""

RETRYABLE: frozenset[str] = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
"""Of those, the ones the workload retries with the same request (next replica)."""

REFUSALS: dict[tuple[str, str], Answer] = {
    ("ALREADY_EXISTS", "IDEMPOTENCY_CONFLICT"): "conflict",
    ("PERMISSION_DENIED", "NOT_A_MEMBER"): "not-member",
}
"""Definite refusals a commit may get, by (code, reason); any other is ``refused``,
which no situation allows."""

ALLOWED: dict[Situation, frozenset[Answer]] = {
    "fresh": frozenset({"ok"}),
    "replay": frozenset({"ok"}),
    "conflict": frozenset({"conflict"}),
    "non-member": frozenset({"not-member"}),
}
"""What a commit may end with in each situation, beside an unknown outcome."""


def answer(code: str, reason: str) -> Answer:
    """The class of a definite refusal."""
    return REFUSALS.get((code, reason), "refused")


def allowed(situation: Situation, outcome: str, code: str = "", reason: str = "") -> bool:
    """Whether a commit completed with ``outcome`` (and status) fits ``situation``."""
    if outcome == "unknown":
        return True
    if outcome == "ok":
        return "ok" in ALLOWED[situation]
    if code in UNKNOWN_OUTCOME:
        return False  # recorded as definite, yet it promises nothing: the workload's bug
    return answer(code, reason) in ALLOWED[situation]


def go_table() -> str:
    """The refusal classes for ``porcupine-check -refusals`` (``"CODE REASON": class``)."""
    return json.dumps({f"{code} {reason}": cls for (code, reason), cls in REFUSALS.items()})
