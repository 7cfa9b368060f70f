"""The recovery queue's policy: when to retry a failed intent, when to quarantine it.

Recovery must never be blocked by its own failures (DESIGN §12). Each failed
attempt pushes the item back by an exponential delay; an item that cannot be
decoded is quarantined at once (no attempt can succeed until an operator
looks), and one that failed ``quarantine_after`` times in a row is
quarantined too. A quarantined item is kept, never deleted and never ACKed;
an operator lists, inspects and retries it (``message-committer quarantine``).

With the defaults an item is retried after 10 s, 20 s, 40 s ... capped at
1 h (each plus the recovery grace, because the scan bound is "due before
now - grace"), and quarantined at its 8th failure, about 21 minutes after
the first. A backend outage fails nothing here: the scan itself fails, and
no attempt is counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """Backoff and quarantine of the recovery queue."""

    first_retry_ms: int = 10_000
    """Delay after the first failed attempt; doubles with each further one."""

    max_retry_ms: int = 3_600_000
    """The longest delay between two attempts of one item."""

    quarantine_after: int = 8
    """Failed attempts after which an item is quarantined."""

    def retry_after_ms(self, attempts: int) -> int:
        """The delay before attempt ``attempts + 1`` (``attempts`` >= 1 failed so far)."""
        exponent = min(max(attempts - 1, 0), 40)
        return min(self.max_retry_ms, self.first_retry_ms * (1 << exponent))

    def quarantines(self, attempts: int) -> bool:
        return attempts >= self.quarantine_after
