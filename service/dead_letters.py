"""``message-committer relay-dead-letters``: list, or requeue, the relay's dead letters.

    message-committer relay-dead-letters --backend redis            # list them all
    message-committer relay-dead-letters --backend redis --requeue  # deliver them again

Opens the backend directly, like ``migrate`` (the same flags and ``MC_*``
variables as ``serve``). Lists every partition's dead letters, one line
each: partition, letter id, tenant, conversation, seq, message id, attempts
and the problem (never a message body: an outbox entry has none).
``--requeue`` moves each back into its partition as a new pending entry; the
relays deliver it, and mailboxes dedupe by message id, so a message that was
delivered after all is not added twice. Except a letter whose message is older
than the mailbox dedupe window (``MC_MAILBOX_DEDUPE_WINDOW``, less its margin:
``service.domain.mailbox.too_old_to_deliver``): a lane may have forgotten its id,
so it stays a dead letter and its line says "not requeued" (the relay would
refuse it anyway; the message is in history). The last line counts the letters
held; the relays drop letters older than MC_RELAY_DEAD_LETTER_RETENTION
(default 30 d), counted in ``message_committer_relay_dead_letters_trimmed_total``.
Exit 0, 2 for bad configuration, 3 when the backend does not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import defaultdict
from collections.abc import Sequence

from service import config as service_config
from service.config import ConfigError, ServiceConfig, StartupError
from service.domain.delivery import DeliveryPorts
from service.domain.mailbox import too_old_to_deliver
from service.domain.ports import SystemClock
from service.domain.relay import DeadLetter

PROG = "message-committer relay-dead-letters"
PAGE = 500
MAX_PAGES = 10_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requeue", action="store_true", help="move every dead letter back into its partition"
    )
    service_config.add_arguments(parser)
    return parser


async def too_old(delivery: DeliveryPorts, letters: Sequence[DeadLetter], now_ms: int) -> set[str]:
    """The letters whose message the dedupe window no longer covers: by its record's
    server timestamp (history), else by when the entry was published."""
    window = delivery.mailbox.settings.dedupe_ms
    by_conversation: defaultdict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
    for d in letters:
        by_conversation[(d.entry.tenant, d.entry.conversation)].append(d)
    old: set[str] = set()
    for (tenant, conversation), found in by_conversation.items():
        seqs = sorted({d.entry.seq for d in found})
        records = await delivery.records.records(tenant, conversation, seqs)
        for d in found:
            record = records.get(d.entry.seq)
            mine = record is not None and record.message_id == d.entry.message_id
            ts = record.server_ts_ms if record is not None and mine else d.entry.published_ms
            if ts and too_old_to_deliver(ts, now_ms=now_ms, window_ms=window):
                old.add(d.letter)
    return old


async def requeue_letters(
    delivery: DeliveryPorts, partition: str, letters: Sequence[DeadLetter], now_ms: int
) -> tuple[int, list[DeadLetter]]:
    """Requeue ``letters`` of ``partition`` but those older than the dedupe window:
    (how many were moved, the refused ones, left as they are)."""
    old = await too_old(delivery, letters, now_ms)
    refused = [d for d in letters if d.letter in old]
    wanted = [d.letter for d in letters if d.letter not in old]
    moved = await delivery.partitions.requeue(partition, wanted) if wanted else 0
    return moved, refused


async def run(config: ServiceConfig, requeue: bool) -> int:
    from service.bootstrap import open_backend

    backend = await open_backend(config)
    try:
        if backend.delivery is None or not backend.delivery.shared:
            raise ConfigError("the memory backend's dead letters live inside serve")
        delivery = backend.delivery
        partitions = delivery.partitions
        total = moved = refused = 0
        for partition in partitions.partitions():
            after = ""
            letters: list[DeadLetter] = []
            for _ in range(MAX_PAGES):
                page, after = await partitions.dead_letters(partition, after, PAGE)
                for d in page:
                    e = d.entry
                    print(
                        f"{partition} {d.letter} tenant={e.tenant} conversation={e.conversation}"
                        f" seq={e.seq} message_id={e.message_id} attempts={d.attempts}"
                        f" problem={d.problem!r}"
                    )
                letters += page
                if not after:
                    break
            total += len(letters)
            if requeue and letters:
                now = await backend.server_time() if backend.server_time else SystemClock().now_ms()
                done, old = await requeue_letters(delivery, partition, letters, now)
                for d in old:
                    print(
                        f"{partition} {d.letter} not requeued: older than the mailbox dedupe"
                        " window (MC_MAILBOX_DEDUPE_WINDOW); the message is in history"
                    )
                moved += done
                refused += len(old)
        summary = f", requeued: {moved}, refused as too old: {refused}" if requeue else ""
        print(f"dead letters: {total}{summary}")
        return 0
    finally:
        await backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    requeue = bool(args.requeue)
    flags = {k: v for k, v in vars(args).items() if k != "requeue"}
    try:
        config = service_config.load(flags, os.environ)
        return asyncio.run(run(config, requeue))
    except StartupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
