"""How far this replica's clock is from the cluster's, and the refusal beyond a bound.

The Scylla backend decides expiry (idempotency windows, retention, queue
times) by the store's clock, which is this replica's (DESIGN §12): CQL has
no server-side "now" a conditional write could compare against. So every
replica measures its clock against the coordinator's at open and in every
readiness probe: ``SELECT toUnixTimestamp(now()) FROM system.local`` a few
times; per sample, offset = server time - the midpoint of the request, with
an uncertainty of half the round trip; the sample with the smallest round
trip wins. A replica whose offset is beyond the bound even after allowing
for that uncertainty refuses to serve (StoreMisconfigured, with a hint for
the operator). docs/scylla.md says what the remaining allowed skew can do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from backends.scylla.session import CqlSession
from service.domain.errors import StoreMisconfigured, StoreUnavailable
from service.domain.ports import Clock

STATEMENTS = {"clock.now": "SELECT toUnixTimestamp(now()) AS now_ms FROM system.local"}
SAMPLES_AT_OPEN = 5
SAMPLES_AT_READINESS = 2

HINT = (
    "this replica's clock is too far from the Scylla cluster's; it decides expiry and"
    " idempotency windows, so it refuses to serve: fix the host's time sync (NTP/chrony),"
    " or raise MC_SCYLLA_MAX_CLOCK_SKEW"
)


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """Cluster time minus this replica's clock, and how sure we are of it."""

    offset_ms: float
    uncertainty_ms: float

    def beyond(self, bound_ms: int) -> bool:
        """True when the offset is larger than ``bound_ms`` whatever the uncertainty."""
        return abs(self.offset_ms) - self.uncertainty_ms > bound_ms


async def measure(cql: CqlSession, clock: Clock, samples: int) -> ClockOffset:
    best: ClockOffset | None = None
    for _ in range(max(1, samples)):
        before_ns = time.perf_counter_ns()
        before = clock.now_ms()
        rows = await cql.read("clock.now", ())
        rtt_ms = (time.perf_counter_ns() - before_ns) / 1e6
        if not rows or rows[0].get("now_ms") is None:
            raise StoreUnavailable("scylla: the cluster did not tell its time")
        server = int(rows[0]["now_ms"])
        sample = ClockOffset(server - (before + rtt_ms / 2), rtt_ms / 2)
        if best is None or sample.uncertainty_ms < best.uncertainty_ms:
            best = sample
    assert best is not None
    return best


@dataclass(slots=True)
class LastOffset:
    """The offset the last check measured (ms, cluster minus replica); None before
    the first. Called by the metrics at scrape time."""

    offset_ms: float | None = None

    def __call__(self) -> float | None:
        return self.offset_ms


async def check(
    cql: CqlSession,
    clock: Clock,
    bound_ms: int | None,
    samples: int,
    last: LastOffset | None = None,
) -> None:
    """Raise StoreMisconfigured when this replica's clock is beyond ``bound_ms``
    (None: not checked; for tests that drive time with a manual clock). ``last``
    keeps what was measured, also when it is beyond the bound."""
    if bound_ms is None:
        return
    offset = await measure(cql, clock, samples)
    if last is not None:
        last.offset_ms = offset.offset_ms
    if offset.beyond(bound_ms):
        raise StoreMisconfigured(
            f"scylla: this replica's clock is {abs(offset.offset_ms) / 1000:.1f}s"
            f" {'behind' if offset.offset_ms > 0 else 'ahead of'} the cluster's"
            f" (allowed {bound_ms / 1000:.1f}s)",
            HINT,
        )
