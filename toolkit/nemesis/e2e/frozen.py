"""Each message's frozen membership version, as its mailbox entries carry it.

The delivery checker judges a message's recipients at the membership version its
delivery was frozen at (DESIGN §9; ``proc_check.Ledger.recipient``). Neither the
ACK nor a History record carries that version; every mailbox entry does
(``MailboxEntry.membership_version``, the outbox entry's). ``FrozenVersions``
reads every user's inbox straight from the run's storage (the backend
``epochs.LaneEpochs`` opens, through the storage proxies like the replicas),
during the run (a ``new-epoch`` fault drops a lane's older entries) and at the
settle, and keeps every version it saw per message id; ``into`` gives the ledger
the one version of each. A message no read saw stays judged by the windows.

==================  ===========================================================
frozen-version      one message's entries carry two membership versions (its
                    delivery froze one set of recipients)
==================  ===========================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.domain.delivery import MailboxStore
from service.domain.mailbox import INBOX, MAX_PAGE_BYTES, UNKNOWN_VERSION, Mailbox, MailboxCursor
from toolkit.client_campaign.proc_check import Ledger

EVERY_S = 2.0
"""How often the run reads the inboxes' versions while the faults go on."""
READ_TIMEOUT_S = 5.0
"""A read a fault holds up is given up (the next one tries again)."""
PAGE = 500


@dataclass
class FrozenVersions:
    seen: dict[str, set[int]] = field(default_factory=dict)
    reads: int = 0
    """Inboxes read whole."""
    failed: int = 0
    """Inbox reads a fault (or a new epoch under the read) cut short."""
    cursors: dict[str, MailboxCursor] = field(default_factory=dict)
    """Where the last whole read of each user's inbox ended."""

    def add(self, message_id: str, version: int) -> None:
        if version != UNKNOWN_VERSION:  # a release-1 entry: recipients frozen inline
            self.seen.setdefault(message_id, set()).add(version)

    def into(self, ledger: Ledger) -> None:
        """Each message's version into ``ledger.frozen`` (none for a disagreement)."""
        for message_id, versions in self.seen.items():
            if len(versions) == 1:
                ledger.frozen[message_id] = next(iter(versions))
            else:
                ledger.frozen.pop(message_id, None)

    def anomalies(self) -> list[str]:
        return [
            f"frozen-version: {message_id} has entries at membership versions {sorted(seen)}"
            for message_id, seen in sorted(self.seen.items())
            if len(seen) > 1
        ]

    async def read(self, store: MailboxStore, tenant: str, users: Sequence[str]) -> None:
        """Read every user's inbox from its trim watermark to its head."""
        for user in users:
            try:
                await asyncio.wait_for(self._inbox(store, Mailbox.inbox(tenant, user)),
                                       READ_TIMEOUT_S)  # fmt: skip
                self.reads += 1
            except Exception:  # a fault in the way, or CursorExpired: the next read
                self.failed += 1

    async def _inbox(self, store: MailboxStore, mailbox: Mailbox) -> None:
        """From where the last read of this inbox stopped (its epoch unchanged and
        not trimmed past), else from the trim watermark: each read costs what was
        appended since, not the whole lane."""
        (state,) = await store.lane_state([mailbox])
        cursor = self.cursors.get(mailbox.owner)
        if cursor is None or cursor.epoch != state.epoch or cursor.seq < state.watermark:
            cursor = MailboxCursor(INBOX, state.epoch, state.watermark)
        while True:
            page = await store.sync(mailbox, cursor, PAGE, MAX_PAGE_BYTES)
            for entry in page.entries:
                self.add(entry.record.message_id, entry.membership_version)
            if not page.more or page.next_cursor == cursor:
                self.cursors[mailbox.owner] = page.next_cursor
                return
            cursor = page.next_cursor
