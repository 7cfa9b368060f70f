"""Prometheus series of the outbox relay (``message-committer relay``, or inside
``serve`` on memory); also the relay's RelayObserver.

===================================================  ===================================
series                                               meaning
===================================================  ===================================
message_committer_relay_lag_seconds                  age of the oldest outbox entry not
                                                     yet delivered, over this relay's
                                                     partitions (0 when drained)
message_committer_relay_delivered_entries_total      outbox entries settled as sent
message_committer_relay_fanout_entries_total         mailbox entries written (fan-out)
message_committer_relay_duplicate_entries_total      items a mailbox already held (the
                                                     at-least-once outbox, deduped)
message_committer_relay_delivery_seconds             publication to settled, per entry
  (histogram)                                        (commit-to-mailbox latency)
message_committer_relay_retries_total                entries settled as retryable
message_committer_relay_dead_letters_total           entries dead-lettered
message_committer_relay_too_old_total                entries dead-lettered because their
                                                     message is older than the mailbox
                                                     dedupe window (never appended again)
message_committer_relay_dead_letters_trimmed_total   dead letters dropped after
                                                     MC_RELAY_DEAD_LETTER_RETENTION
message_committer_relay_dead_letters_held            dead letters kept in the partitions
                                                     this relay holds (its last sweep)
message_committer_relay_reconciled_total{verdict}    unsettled entries a new lease holder
                                                     checked: accepted, rejected, unknown
message_committer_relay_takeovers_total              leases taken with a new fencing token
message_committer_relay_fenced_total                 steps refused because another relay
                                                     holds a newer token (this one was
                                                     deposed)
message_committer_relay_lanes_moved_back_total{lane}  lanes found below the (epoch, head)
                                                     this relay saw (a failover or restore
                                                     lost entries) and restarted in a new
                                                     epoch; lane is inbox or conversation
message_committer_relay_errors_total{kind}           failed steps, by error class
message_committer_relay_partitions_held              partitions this relay holds now
message_committer_relay_partitions                   partitions of the outbox
message_committer_relay_live_relays                  relays announcing themselves
===================================================  ===================================

No label carries an id, a partition name or an address.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.domain.lane_marks import LaneMark
from service.domain.relay import Verdict

RELAY_LOGGER = "service.relay"
"""The one logger name of the relay (runner, process, metrics): operators filter on it."""

log = logging.getLogger(RELAY_LOGGER)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RelayMetrics:
    """The relay's series in ``registry`` (the server's, or one of its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.lag = Gauge(
            "message_committer_relay_lag_seconds",
            "Age of the oldest outbox entry not yet delivered, over the partitions held.",
            registry=r,
        )
        self.delivered = Counter(
            "message_committer_relay_delivered_entries",
            "Outbox entries settled as sent.",
            registry=r,
        )
        self.fanout = Counter(
            "message_committer_relay_fanout_entries",
            "Mailbox entries written.",
            registry=r,
        )
        self.duplicates = Counter(
            "message_committer_relay_duplicate_entries",
            "Items a mailbox already held (deduped by message id).",
            registry=r,
        )
        self.delivery_seconds = Histogram(
            "message_committer_relay_delivery_seconds",
            "From publication to the outbox until delivered into every mailbox.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "message_committer_relay_retries", "Entries settled as retryable.", registry=r
        )
        self.dead_letters = Counter(
            "message_committer_relay_dead_letters", "Entries dead-lettered.", registry=r
        )
        self.too_old = Counter(
            "message_committer_relay_too_old",
            "Entries dead-lettered as older than the mailbox dedupe window.",
            registry=r,
        )
        self.dead_letters_trimmed = Counter(
            "message_committer_relay_dead_letters_trimmed",
            "Dead letters dropped after MC_RELAY_DEAD_LETTER_RETENTION.",
            registry=r,
        )
        self.dead_letters_held = Gauge(
            "message_committer_relay_dead_letters_held",
            "Dead letters kept in the partitions this relay holds, at its last sweep.",
            registry=r,
        )
        self.reconciled = Counter(
            "message_committer_relay_reconciled",
            "Unsettled entries a new lease holder checked, by verdict.",
            ("verdict",),
            registry=r,
        )
        self.takeovers = Counter(
            "message_committer_relay_takeovers",
            "Partition leases taken with a new fencing token.",
            registry=r,
        )
        self.fenced = Counter(
            "message_committer_relay_fenced",
            "Steps refused because another relay holds a newer fencing token.",
            registry=r,
        )
        self.lanes_moved_back = Counter(
            "message_committer_relay_lanes_moved_back",
            "Lanes found below the (epoch, head) this relay saw, restarted in a new epoch.",
            ("lane",),
            registry=r,
        )
        self.errors = Counter(
            "message_committer_relay_errors",
            "Relay steps that failed, by error class.",
            ("kind",),
            registry=r,
        )
        self.partitions_held = Gauge(
            "message_committer_relay_partitions_held",
            "Outbox partitions this relay holds a lease on.",
            registry=r,
        )
        self.partitions = Gauge(
            "message_committer_relay_partitions", "Partitions of the outbox.", registry=r
        )
        self.live_relays = Gauge(
            "message_committer_relay_live_relays",
            "Relays that announced themselves within a lease period.",
            registry=r,
        )
        for result in Verdict:
            self.reconciled.labels(result.value)
        for lane in ("inbox", "conversation"):
            self.lanes_moved_back.labels(lane)

    # --- RelayObserver ------------------------------------------------------

    def on_delivered(self, entries: int, added: int, duplicates: int, ages_ms: list[int]) -> None:
        self.delivered.inc(entries)
        self.fanout.inc(added)
        self.duplicates.inc(duplicates)
        for age in ages_ms:
            self.delivery_seconds.observe(max(0, age) / 1000)

    def on_retried(self, entries: int) -> None:
        self.retries.inc(entries)

    def on_dead_lettered(self, entries: int) -> None:
        self.dead_letters.inc(entries)

    def on_too_old(self, entries: int) -> None:
        self.too_old.inc(entries)
        log.warning(
            "relay: %d entries are older than the mailbox dedupe window"
            " (MC_MAILBOX_DEDUPE_WINDOW) and were dead-lettered, not appended again",
            entries,
        )

    def on_reconciled(self, result: Verdict, entries: int) -> None:
        self.reconciled.labels(result.value).inc(entries)

    def on_lane_moved_back(self, kind: str, seen: LaneMark, found: LaneMark, epoch: int) -> None:
        self.lanes_moved_back.labels(kind).inc()
        log.warning(
            "relay: a %s lane moved back (seen epoch %d head %d, found epoch %d head %d, "
            "lost entries: a failover or restore); restarted it in epoch %d, its clients rebuild",
            kind, seen.epoch, seen.head, found.epoch, found.head, epoch,
        )  # fmt: skip
