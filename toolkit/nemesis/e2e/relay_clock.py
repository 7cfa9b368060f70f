"""``clock-relay``: a relay restarted under ``faketime``, its wall clock really off.

The relay stops, starts again with libfaketime preloaded (``FAKETIME=+Ns``, the
monotonic clock left alone, the offsets of ``replica_faults.CLOCK_OFFSETS_S``: inside
and beyond the Scylla guard, an hour ahead), and at the fault's end restarts on the
true clock. A relay opens its backend as a replica does, so it measures the skew the
same way: on Redis it warns and takes time from Redis (over 1 s), on Scylla beyond
the guard it refuses to start (the expected effect: that relay is down for the
fault, the other one takes its partitions once its lease runs out). Proven as a
replica's clock fault is (``replica_faults.prove_clock``): a probe under the same
setting reads the offset, and the relay's own log reports the skew where one is due.
"""

from __future__ import annotations

from toolkit.nemesis.proof import Proof
from toolkit.nemesis.replica_faults import (
    faketime_env,
    faketime_library,
    prove_clock,
    refuses_for,
    start_service,
)
from toolkit.soak.procs import Proc

KIND = "clock-relay"
FAKETIME_KEYS = ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")


class RelayClock:
    """Begins, ends and proves ``clock-relay`` on a list of relay processes."""

    def __init__(self, relays: list[Proc], backend: str, start_retry_s: float) -> None:
        self.relays = relays
        self.backend = backend
        self.start_retry_s = start_retry_s
        self.library = faketime_library()
        self._clock: dict[int, tuple[float, int, bool]] = {}
        """target: (offset wanted, log size at the restart, refused to start)."""

    def begin(self, target: int, offset_s: float) -> None:
        assert self.library is not None
        relay = self.relays[target]
        at = relay.log_size()
        relay.stop()
        relay.env.update(faketime_env(offset_s, self.library))
        refused = not self._start(relay, expect_refusal=refuses_for(self.backend, offset_s))
        self._clock[target] = (offset_s, at, refused)

    def end(self, target: int) -> None:
        relay = self.relays[target]
        relay.stop()
        for key in FAKETIME_KEYS:
            relay.env.pop(key, None)
        self._start(relay)

    def prove_begin(self, target: int) -> Proof:
        assert self.library is not None
        wanted, at, refused = self._clock[target]
        relay = self.relays[target]
        return prove_clock(self.backend, self.library, wanted, lambda: relay.log_since(at),
                           refused)  # fmt: skip

    def _start(self, relay: Proc, expect_refusal: bool = False) -> bool:
        return start_service(relay, self.start_retry_s, expect_refusal)
