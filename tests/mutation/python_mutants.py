"""The few domain and memory-backend mutants the CI smoke applies by hand
(mutmut runs the full set; see docs/mutation.md)."""

# ruff: noqa: E501  (the texts are exact lines of the mutated sources)

from __future__ import annotations

from tests.mutation.hook import Edit, Mutant, Promise

MEMORY = "backends.memory.store"
COMMITTER = "service.domain.committer"


def _py(id: str, promise: Promise, what: str, module: str, old: str, new: str) -> Mutant:
    return Mutant(id, "python", promise, what, (Edit(module, old, new),))


PYTHON_MUTANTS: tuple[Mutant, ...] = (
    _py(
        "memory-reserve-no-identity-compare", "conflict",
        "reserve of a known key with a different request is not a conflict",
        MEMORY,
        "            if not request.matches_identity(existing.identity):\n"
        "                return Conflict(request.key)\n",
        "",
    ),
    _py(
        "memory-reserve-seq-before-exists", "seq",
        "reserve allocates a seq before it checks whether the key exists",
        MEMORY,
        "        key = _k(request.key)\n        existing = self._stored(key)\n",
        "        key = _k(request.key)\n"
        "        self._members.conversation(request.tenant, request.conversation).last_seq += 1\n"
        "        existing = self._stored(key)\n",
    ),
    _py(
        "memory-reserve-no-queue-entry", "recovery",
        "reserve does not put the intent in the recovery queue",
        MEMORY, "        self.state.queue[key] = QueueEntry(created_at_ms=now, due_ms=now)\n", "",
    ),
    _py(
        "memory-history-no-member-check", "authorisation",
        "history pages are served to non-members",
        MEMORY, "        reader = reader_of(conv.intervals.get(query.actor, ()))",
        "        reader = conv.intervals.get(query.actor, ()) or (1,)",
    ),
    _py(
        "drive-store-error-acks", "ACK",
        "a store that refuses mid-commit (StoreError) is answered with an ACK",
        COMMITTER,
        '            except StoreError as exc:  # corrupt data, a vanished conversation: never an ACK\n'
        '                raise self._recoverable(key, conversation, "store refused", exc) from exc\n',
        '            except StoreError:\n'
        '                return self._acked(intent.committed_message())\n',
    ),
)  # fmt: skip
