"""Figures, ratios and the printed table (the JSON file: ``toolkit.bench.document``).

Every figure is computed from one run. Throughput (``ops/s``) counts calls
that got their expected outcome, over the wall time from the common start
to the last process's end. Latencies are nearest-rank percentiles of those
calls. Cost per op is the backend request counter's change over the phase
divided by the ops; it includes the membership read every send makes.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.bench.driver import PhaseResult
from toolkit.bench.slope import Slope
from toolkit.bench.slope import shape as slope_shape
from toolkit.bench.slope import text as slope_text

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9))


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


@dataclass(frozen=True, slots=True)
class Round:
    """One measurement of a phase: what the clients saw and what the backend did."""

    result: PhaseResult
    requests: Counter[str] | None
    """The backend request counter's change over the round (None: unknown)."""


def _rate(result: PhaseResult) -> float:
    return result.ok / result.elapsed_s if result.calls else 0.0


@dataclass
class Phase:
    """The figures of one workload or floor, over all its rounds."""

    name: str
    kind: str
    """"workload" (over gRPC) or "floor"."""
    description: str
    calls: int
    ok: int
    duration_s: float
    ops_per_s: float
    """The median over the rounds."""
    round_ops_per_s: list[float]
    latency_ms: dict[str, float]
    """Percentiles over every round's calls."""
    expected: dict[str, int]
    errors: dict[str, int]
    backend_requests: dict[str, int] | None
    cost_per_op: dict[str, float] | None
    server_cpu_measured: bool
    """False for an external server (--target): its CPU is not this process's."""
    server_cpu_us_per_op: float
    """CPU of the server process (in-process floors: of this process) per op."""
    client_cpu_us_per_op: float
    server_gc_us_per_op: float
    """Of the server CPU, the time in Python's cyclic garbage collector."""

    @classmethod
    def build(
        cls,
        name: str,
        kind: str,
        description: str,
        rounds: Sequence[Round],
        server_cpu_measured: bool = True,
    ) -> Phase:
        result = PhaseResult.merge([r.result for r in rounds])
        ordered = sorted(result.latencies_us)
        latency = {label: percentile(ordered, pct) / 1000.0 for label, pct in PERCENTILES}
        latency["max"] = (ordered[-1] / 1000.0) if ordered else 0.0
        latency["mean"] = (sum(ordered) / len(ordered) / 1000.0) if ordered else 0.0
        delta: dict[str, int] | None = None
        cost: dict[str, float] | None = None
        if rounds and all(r.requests is not None for r in rounds):
            total: Counter[str] = Counter()
            for r in rounds:
                total.update(r.requests or {})
            delta = dict(sorted(total.items()))
            cost = {k: (v / result.ok if result.ok else 0.0) for k, v in delta.items()}
        rates = [_rate(r.result) for r in rounds]
        per_op = 1e6 / result.ok if result.ok else 0.0
        server_per_op = per_op if server_cpu_measured else 0.0
        return cls(
            name=name,
            kind=kind,
            description=description,
            calls=result.calls,
            ok=result.ok,
            duration_s=sum(r.result.elapsed_s for r in rounds if r.result.calls),
            ops_per_s=statistics.median(rates) if rates else 0.0,
            round_ops_per_s=rates,
            latency_ms=latency,
            expected=dict(result.expected),
            errors=dict(result.errors),
            backend_requests=delta,
            cost_per_op=cost,
            server_cpu_measured=server_cpu_measured,
            server_cpu_us_per_op=result.server_cpu_s * server_per_op,
            client_cpu_us_per_op=result.client_cpu_s * per_op,
            server_gc_us_per_op=result.server_gc_s * server_per_op,
        )

    @property
    def tail_ratio(self) -> float:
        p50 = self.latency_ms["p50"]
        return self.latency_ms["p99"] / p50 if p50 > 0 else 0.0


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def phase_ratio(a: Phase | None, b: Phase | None) -> float | None:
    """a/b throughput: the median of per-round ratios (phases of one round ran
    back to back, so they shared the machine's load), else of the medians."""
    if a is None or b is None or not a.ok or not b.ok:
        return None
    pairs = list(zip(a.round_ops_per_s, b.round_ops_per_s, strict=False))
    if len(a.round_ops_per_s) == len(b.round_ops_per_s) and all(y > 0 for _, y in pairs):
        return statistics.median(x / y for x, y in pairs)
    return ratio(a.ops_per_s, b.ops_per_s)


@dataclass
class BackendReport:
    """Everything measured on one backend."""

    backend: str
    server: str
    phases: dict[str, Phase] = field(default_factory=dict)
    redis_record: dict[str, Any] | None = None
    footprint: dict[str, dict[str, int | None]] | None = None
    """Bytes stored per unfinished intent and per committed message, small vs big."""
    notes: list[str] = field(default_factory=list)
    slope: Slope | None = None
    """The sustained phase's last-tenth over first-tenth commit rate."""
    rounds: dict[str, list[Round]] = field(default_factory=dict, repr=False)
    """The raw rounds of every phase (not written to JSON; ``merge_reports`` uses them)."""

    def rate(self, name: str) -> float | None:
        phase = self.phases.get(name)
        return phase.ops_per_s if phase is not None and phase.ok else None

    def cost(self, name: str, kind: str) -> float | None:
        phase = self.phases.get(name)
        if phase is None or phase.cost_per_op is None or not phase.ok:
            return None
        return phase.cost_per_op.get(kind, 0.0)

    def ratios(self) -> dict[str, float | None]:
        get = self.phases.get
        fresh = get("fresh")
        return {
            "service_over_grpc_floor": phase_ratio(fresh, get("grpc-floor")),
            "service_over_storage_floor": phase_ratio(fresh, get("storage-floor")),
            "service_over_committer_floor": phase_ratio(fresh, get("committer-floor")),
            "replay_over_fresh": phase_ratio(get("replay"), fresh),
            "storage_replay_over_fresh": phase_ratio(get("storage-replay"), get("storage-floor")),
            "hot_over_spread": phase_ratio(get("hot"), fresh),
            "big_over_fresh": phase_ratio(get("big"), fresh),
            "p99_over_p50": fresh.tail_ratio if fresh is not None and fresh.ok else None,
            "lwt_floor_over_fresh": phase_ratio(get("lwt-floor"), fresh),
        }

    def cpu_ratios(self) -> dict[str, float | None]:
        """The same throughput ratios estimated from CPU per op (server + clients).

        When the box is CPU-bound, a/b throughput is about cpu(b)/cpu(a); CPU per op
        hardly moves with other processes' load, throughput does. Backend servers
        (redis-server, the CQL node) are not in these figures."""
        get = self.phases.get
        return {
            "service_over_grpc_floor": cpu_ratio(get("fresh"), get("grpc-floor")),
            "replay_over_fresh": cpu_ratio(get("replay"), get("fresh")),
            "hot_over_spread": cpu_ratio(get("hot"), get("fresh")),
            "lwt_floor_over_fresh": cpu_ratio(get("lwt-floor"), get("fresh")),
        }


def merge_reports(parts: Sequence[BackendReport], note: str) -> BackendReport:
    """One report of several runs of one backend: each phase rebuilt from all their rounds."""
    first = parts[0]
    merged = BackendReport(first.backend, first.server, notes=[*first.notes, note])
    for name, phase in first.phases.items():
        rounds = [r for part in parts for r in part.rounds.get(name, [])]
        merged.rounds[name] = rounds
        merged.phases[name] = Phase.build(
            name, phase.kind, phase.description, rounds, phase.server_cpu_measured
        )
    merged.redis_record = parts[-1].redis_record
    merged.footprint = parts[-1].footprint
    merged.slope = parts[-1].slope
    return merged


def cpu_ratio(a: Phase | None, b: Phase | None) -> float | None:
    """a/b throughput as estimated from CPU per op: cpu(b) / cpu(a)."""
    if a is None or b is None or not a.ok or not b.ok:
        return None
    if not (a.server_cpu_measured and b.server_cpu_measured):
        return None
    cost_a = a.server_cpu_us_per_op + a.client_cpu_us_per_op
    cost_b = b.server_cpu_us_per_op + b.client_cpu_us_per_op
    return cost_b / cost_a if cost_a > 0 else None


# --- text ----------------------------------------------------------------------

_SHORT = {"statement": "stmt", "redis_call": "calls", "serial_read": "serial", "wire_lwt": "wcond"}


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def _cost(cost: dict[str, float] | None) -> str:
    if cost is None:
        return "n/a"
    shown = {k: v for k, v in cost.items() if v > 0}
    return " ".join(f"{_SHORT.get(k, k)} {v:.2f}" for k, v in sorted(shown.items())) or "0"


def num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def phase_table(phases: Iterable[Phase]) -> list[str]:
    head = (
        f"{'phase':<16}{'calls':>9}{'ops/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'p99.9 ms':>10}{'p99/p50':>9}{'srv us':>8}{'gc us':>7}{'cli us':>8}"
        f"  {'cost per op':<34}{'errors'}"
    )
    lines = [head, "-" * len(head)]
    for p in phases:
        lat = p.latency_ms
        errors = _counts(p.errors)
        others = {k: v for k, v in p.expected.items() if k != "OK"}
        if others:
            errors += f" (expected: {_counts(others)})"
        server = (
            f"{p.server_cpu_us_per_op:>8.0f}{p.server_gc_us_per_op:>7.0f}"
            if p.server_cpu_measured
            else f"{'n/a':>8}{'n/a':>7}"
        )
        lines.append(
            f"{p.name:<16}{p.calls:>9}{p.ops_per_s:>10.1f}{lat['p50']:>9.2f}{lat['p90']:>9.2f}"
            f"{lat['p99']:>9.2f}{lat['p999']:>10.2f}{p.tail_ratio:>9.2f}{server}"
            f"{p.client_cpu_us_per_op:>8.0f}  {_cost(p.cost_per_op):<34}{errors}"
        )
    return lines


def backend_text(report: BackendReport) -> list[str]:
    lines = [f"== {report.backend}: {report.server} =="]
    lines += phase_table(report.phases.values())
    r = report.ratios()
    lines.append(
        "ratios: service/gRPC floor "
        + num(r["service_over_grpc_floor"])
        + " | service/storage floor "
        + num(r["service_over_storage_floor"])
        + " | service/committer floor "
        + num(r["service_over_committer_floor"])
        + " | replay/fresh "
        + num(r["replay_over_fresh"])
        + " (storage "
        + num(r["storage_replay_over_fresh"])
        + ") | hot/spread "
        + num(r["hot_over_spread"])
        + " | p99/p50 (fresh) "
        + num(r["p99_over_p50"])
    )
    c = report.cpu_ratios()
    lines.append(
        "from CPU per op (server + clients): service/gRPC floor "
        + num(c["service_over_grpc_floor"])
        + " | replay/fresh "
        + num(c["replay_over_fresh"])
        + " | hot/spread "
        + num(c["hot_over_spread"])
    )
    if r.get("lwt_floor_over_fresh") is not None:
        lines.append(
            "a fresh commit costs "
            + num(r["lwt_floor_over_fresh"])
            + " x the cheapest conditional write (lwt-floor ops/s over fresh; from CPU per op "
            + num(c.get("lwt_floor_over_fresh"))
            + ")"
        )
    if report.slope is not None:
        lines.append(slope_text(report.slope))
        lines.append(slope_shape(report.slope))
    for label, sizes in (report.footprint or {}).items():
        lines.append(
            f"stored bytes, {label} ({sizes.get('members')} members): unfinished intent "
            f"{sizes.get('intent_bytes')} B, committed {sizes.get('committed_bytes')} B"
        )
    rec = report.redis_record
    if rec:
        lines.append(
            f"redis committed record ({rec.get('body_bytes')} B body): "
            f"{rec.get('memory_usage_bytes')} B, {rec.get('encoding')}; before compaction "
            f"{rec.get('precompaction_memory_usage_bytes')} B, "
            f"{rec.get('precompaction_encoding')}"
        )
    lines += [f"note: {n}" for n in report.notes]
    return lines


# --- JSON ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """Where the figures came from."""
    model, mem_kib = "", 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
                    break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": cpus,
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
    }
