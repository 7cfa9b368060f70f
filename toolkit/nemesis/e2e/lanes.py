"""The lane model: what every Sync a lane reader made may have answered.

A reader keeps a cursor per user's inbox and records each read as a ``LaneRead``:
the cursor it passed, the seqs the page covered (its entries and the ``withheld``
seqs it stands in for, so a page is gap-free), the message id at each entry's seq,
the cursor it was given next, or that the server said ``CursorExpired`` (the reader
then starts again from the lane's start). Rules, per lane:

==================  ===========================================================
gap                 a page from a cursor in epoch E that stays in E does not
                    cover exactly cursor.seq + 1, + 2, ... (a seq skipped,
                    repeated or out of order)
next-cursor         the next cursor is not the page's last seq (or the passed
                    one for an empty page)
silent-epoch        the epoch changed under a cursor inside an epoch, without
                    the server saying CursorExpired first
duplicate-entry     one message id at two seqs of one epoch of a lane
reused-seq          one (lane, epoch, seq) showed two message ids
==================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.soak.ledger import Observations, Seen


@dataclass(frozen=True, slots=True)
class LaneRead:
    lane: str
    """``inbox:<user>``"""
    epoch: int
    seq: int
    """The cursor passed (epoch 0: the lane's start)."""
    entries: tuple[tuple[int, str], ...] = ()
    """(seq, message id) of each entry the page held."""
    withheld: tuple[int, ...] = ()
    next_epoch: int = 0
    next_seq: int = 0
    expired: bool = False


@dataclass
class LaneFindings:
    reads: int = 0
    entries: int = 0
    expired: int = 0
    anomalies: list[str] = field(default_factory=list)


def check(reads: list[LaneRead]) -> LaneFindings:
    found = LaneFindings(reads=len(reads))
    seen = Observations()
    ids_at: dict[tuple[str, int, str], int] = {}
    for r in reads:
        if r.expired:
            found.expired += 1
            continue
        found.entries += len(r.entries)
        where = f"{r.lane} from ({r.epoch}, {r.seq})"
        covered = sorted([s for s, _ in r.entries] + list(r.withheld))
        if r.epoch and r.next_epoch != r.epoch:
            found.anomalies.append(
                f"silent-epoch: {where} answered epoch {r.next_epoch} without CursorExpired"
            )
            continue
        first = r.seq + 1 if r.epoch else (covered[0] if covered else 0)
        if covered != list(range(first, first + len(covered))):
            found.anomalies.append(f"gap: {where} covered seqs {covered}")
        last = covered[-1] if covered else r.seq
        if r.next_seq != last:
            found.anomalies.append(f"next-cursor: {where} covered up to {last}, next {r.next_seq}")
        for seq, message_id in r.entries:
            seen.see(r.lane, r.next_epoch, seq, Seen(("", "", ""), message_id))
            before = ids_at.setdefault((r.lane, r.next_epoch, message_id), seq)
            if before != seq:
                found.anomalies.append(
                    f"duplicate-entry: {r.lane} epoch {r.next_epoch} holds {message_id}"
                    f" at seqs {before} and {seq}"
                )
    found.anomalies += [f"reused-seq: {text.removeprefix('reused seq: ')}" for text in seen.reused]
    return found
