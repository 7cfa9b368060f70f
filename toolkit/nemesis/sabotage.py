"""A deliberately broken build for ``nemesis --sabotage``: do the checkers see it?

The service has no switch that disables a promise. To show that the nemesis
catches a broken build, this module copies the importable packages of this
checkout into the run's work directory and edits the copy; the replicas then
run ``python -m service.cli`` from there, so the copy shadows the installed
packages. The checkout itself is never changed.

One mode per rule of the checkers (``MODES``; ``nemesis --help`` lists them), each
of which a run must catch:

* ``identity``: a reserve treats every stored identity as this send's, so a
  conflicting reuse of a committed key is answered with the original ACK
  (``conflict-acked``);
* ``changed-replay``: a replay of a committed key answers seq + 1 (``ack-mismatch``,
  ``ack-not-at-seq``);
* ``wrong-refusal``: a conflict is refused FAILED_PRECONDITION instead of
  ALREADY_EXISTS (``wrong-refusal``: the table of ``outcomes.py``);
* ``stale-read``: History leaves out the record at ``last_seq``, the newest message
  (``stale-read`` during the run, ``lost-ack`` at the end).

Delivery modes, for ``--system e2e`` (its devices and lane readers catch them):

* ``skipped-entry``: the relay leaves some appends out (``lost``: a device lacks a
  message History holds);
* ``duplicated-entry`` (Redis): one message at two seqs of a lane
  (``duplicate-entry``);
* ``reused-seq`` (Redis): an append overwrites the lane's last seq (``reused-seq``);
* ``confirmed-other``: a client confirms its pending send with another device's
  message of the same cmid (``wrongly_confirmed``); the devices run the copy too
  (their forkserver starts in it);
* ``coordinates``: the relay puts about one message in eight (by a stable hash of
  its id) into the mailboxes at seq + 1,000,000 instead of its committed seq
  (``coordinates``: a device holds it at another seq than History). Not seq + 1:
  that seq holds another message, which the client's store refuses (its
  ``(conversation, seq)`` is unique), so the device stops applying its inbox and
  the run fails ``stuck`` and ``lost`` instead; a seq no message holds is the
  wrong seq only ``coordinates`` sees;
* ``silent-epoch``: a Sync from a cursor of an earlier epoch of the lane answers from
  the lane's current epoch instead of CursorExpired (``silent-epoch``; the e2e fault
  ``new-epoch`` starts lanes' next epochs during the run).
"""

from __future__ import annotations

import compileall
import shutil
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("service", "backends", "toolkit", "client")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


@dataclass(frozen=True, slots=True)
class Edit:
    path: str
    original: str
    broken: str


@dataclass(frozen=True, slots=True)
class Mode:
    what: str
    edits: tuple[Edit, ...]


_REPLAY = '            self._observer.outcome("replayed")\n'
_REPLAYED = "__import__('dataclasses').replace({0}, seq={0}.seq + 1)  # nemesis --sabotage"
_ITEM = "            item = MailboxItem("
MODES: dict[str, Mode] = {
    "identity": Mode(
        "every stored identity matches: a conflicting request gets the original ACK",
        (
            Edit(
                "service/domain/model.py",
                "        return identity.matches(self, stored)\n",
                "        return True  # nemesis --sabotage identity: every identity matches\n",
            ),
        ),
    ),
    "changed-replay": Mode(
        "a replay of a committed key is answered with seq + 1",
        (
            Edit(
                "service/domain/committer.py",
                f"{_REPLAY}            return result.message\n",
                f"{_REPLAY}            return {_REPLAYED.format('result.message')}\n",
            ),
            Edit(
                "service/domain/committer.py",
                "            return loaded.message\n        if isinstance(loaded, InProgress):\n",
                "            return "
                + _REPLAYED.format("loaded.message")
                + "\n        if isinstance(loaded, InProgress):\n",
            ),
        ),
    ),
    "wrong-refusal": Mode(
        "a conflict is refused FAILED_PRECONDITION instead of ALREADY_EXISTS",
        (
            Edit(
                "service/api/errors.py",
                "IdempotencyConflict: StatusRule(grpc.StatusCode.ALREADY_EXISTS,",
                "IdempotencyConflict: StatusRule(grpc.StatusCode.FAILED_PRECONDITION,",
            ),
        ),
    ),
    "stale-read": Mode(
        "History leaves out the record at last_seq (the newest message)",
        (
            Edit(
                "service/domain/history.py",
                "            records.append(record)\n            used += size\n",
                "            if record.seq != last_seq:  # nemesis --sabotage stale-read\n"
                "                records.append(record)\n            used += size\n",
            ),
        ),
    ),
    "skipped-entry": Mode(
        "the relay leaves out about one mailbox append in eight, as if written",
        (
            Edit(
                "service/domain/relay_appends.py",
                "                if requests[start].mailbox not in broken:\n",
                "                if requests[start].mailbox not in broken and hash(\n"
                "                    requests[start].items[0].message_id\n"
                "                ) % 8 != 3:  # nemesis --sabotage skipped-entry\n",
            ),
        ),
    ),
    "duplicated-entry": Mode(
        "a Redis mailbox append writes an entry at every seventh seq twice (two seqs)",
        (
            Edit(
                "backends/redis/mailbox.py",
                "      redis.call('HSET', ids, mid, head)\n      added = added + 1\n",
                "      redis.call('HSET', ids, mid, head)\n      added = added + 1\n"
                "      if head % 7 == 0 then  -- nemesis --sabotage duplicated-entry\n"
                "        head = head + 1\n"
                "        redis.call('ZADD', entries, head, head .. ':' .. group .. ':' .. now"
                " .. ':' .. ARGV[b + 1]\n"
                "          .. ':' .. ARGV[b + 2] .. ':' .. mid .. ':' .. ARGV[b + 3])\n"
                "      end\n",
            ),
        ),
    ),
    "reused-seq": Mode(
        "a Redis mailbox append that starts at a seq of 11k + 5 overwrites the entry there",
        (
            Edit(
                "backends/redis/mailbox.py",
                "      fresh[mid] = true\n      head = head + 1\n",
                "      fresh[mid] = true\n"
                "      if head % 11 == 5 and added == 0 then  -- nemesis --sabotage reused-seq\n"
                "        redis.call('ZREMRANGEBYSCORE', entries, head, head)\n"
                "      else\n        head = head + 1\n      end\n",
            ),
        ),
    ),
    "confirmed-other": Mode(
        "a client takes another device's message with its pending cmid as its own",
        (
            Edit(
                "client/sqlite/store.py",
                "        if codec.same_identity(record, codec.send_from_bytes(row[0])):\n",
                "        if True:  # nemesis --sabotage confirmed-other\n",
            ),
            Edit(
                "client/runtime.py",
                "        if not codec.same_identity(found, pending.send):\n",
                "        if False:  # nemesis --sabotage confirmed-other\n",
            ),
        ),
    ),
    "coordinates": Mode(
        "the relay delivers about one message in eight at seq + 1000000, not its committed seq",
        (
            Edit(
                "service/domain/relay_worker.py",
                f"{_ITEM}plan.record, plan.lane_version)",
                "            record = plan.record  # nemesis --sabotage coordinates\n"
                "            if __import__('zlib').crc32(record.message_id.encode()) % 8 == 3:\n"
                "                record = __import__('dataclasses').replace(\n"
                "                    record, seq=record.seq + 1_000_000\n"
                "                )\n"
                f"{_ITEM}record, plan.lane_version)",
            ),
        ),
    ),
    "silent-epoch": Mode(
        "a Sync from a cursor of an earlier epoch reads the current epoch from its start",
        (
            Edit(
                "service/domain/mailbox.py",
                "    if cursor.epoch not in (0, state.epoch):\n"
                '        raise CursorExpired(lane, state.epoch, state.watermark, "the lane is in'
                ' another epoch")\n',
                "    if cursor.epoch not in (0, state.epoch):  # nemesis --sabotage silent-epoch\n"
                "        return 0\n",
            ),
        ),
    ),
}


DELIVERY_MODES = frozenset(
    {
        "skipped-entry",
        "duplicated-entry",
        "reused-seq",
        "confirmed-other",
        "coordinates",
        "silent-epoch",
    }
)
"""Modes only ``--system e2e`` catches (its devices and lane readers; the histories
that show each rule are in tests/nemesis/test_e2e_checks.py); the others break a
commit rule, which the commit nemesis catches."""


def describe() -> str:
    """The modes, one a line, for ``--help``."""
    return "\n".join(f"  {name}: {mode.what}" for name, mode in MODES.items())


class SabotageError(RuntimeError):
    """This checkout's source no longer has the line a sabotage edits."""


def broken_build(repo: Path, work: Path, kind: str, *, compiled: bool = True) -> Path:
    """A copy of ``repo``'s packages under ``work`` with sabotage ``kind`` applied
    (``compiled``: byte-compiled too, as a run wants it)."""
    root = work / f"broken-build-{kind}"
    if root.exists():
        shutil.rmtree(root)
    for package in PACKAGES:
        shutil.copytree(repo / package, root / package, ignore=IGNORE)
    for edit in MODES[kind].edits:
        target = root / edit.path
        source = target.read_text()
        if source.count(edit.original) != 1:
            raise SabotageError(
                f"--sabotage {kind}: {edit.path} no longer has the line it breaks; update"
                " toolkit/nemesis/sabotage.py"
            )
        target.write_text(source.replace(edit.original, edit.broken))
    # compiled once here, not by every process that starts from the copy at once
    if compiled:
        compileall.compile_dir(root, quiet=1)
    return root
