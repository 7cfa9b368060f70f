"""The project's performance targets, checked against one run's reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.bench.report import BackendReport, cpu_ratio, num, ratio


@dataclass(frozen=True, slots=True)
class TargetCheck:
    """One target: the value measured, the bound, and whether it holds."""

    name: str
    backend: str
    value: float | None
    bound: float
    comparison: str
    passed: bool | None
    """None when the run did not measure what the target needs."""
    cpu_estimate: float | None = None
    """For throughput ratios: the same ratio from CPU per op (see cpu_ratios)."""


def _check(
    name: str,
    backend: str,
    value: float | None,
    comparison: str,
    bound: float,
    cpu_estimate: float | None = None,
) -> TargetCheck:
    passed: bool | None = None
    if value is not None:
        passed = value >= bound if comparison == ">=" else value <= bound
    return TargetCheck(name, backend, value, bound, comparison, passed, cpu_estimate)


def check_targets(reports: dict[str, BackendReport]) -> list[TargetCheck]:
    """The project's performance targets, for every backend this run measured."""
    checks: list[TargetCheck] = []
    memory, redis = reports.get("memory"), reports.get("redis")
    if memory is not None:
        checks.append(
            _check(
                "memory fresh commits/s >= 0.70 x gRPC floor",
                "memory",
                memory.ratios()["service_over_grpc_floor"],
                ">=",
                0.70,
                memory.cpu_ratios()["service_over_grpc_floor"],
            )
        )
    if memory is not None and memory.slope is not None:
        checks.append(
            _check(
                "memory sustained: last 10 % commits/s >= 0.90 x first 10 %",
                "memory",
                memory.slope.ratio,
                ">=",
                0.90,
            )
        )
    if redis is not None:
        checks.append(
            _check(
                "redis fresh commits/s >= 0.50 x memory fresh",
                "redis",
                ratio(redis.rate("fresh"), memory.rate("fresh") if memory else None),
                ">=",
                0.50,
                cpu_ratio(
                    redis.phases.get("fresh"), memory.phases.get("fresh") if memory else None
                ),
            )
        )
    scylla = reports.get("scylla")
    if scylla is not None:
        checks.append(
            _check(
                "scylla LWT per fresh commit <= 4 (one stream: no contention)",
                "scylla",
                scylla.cost("fresh-serial", "lwt"),
                "<=",
                4,
            )
        )
        checks.append(
            _check(
                "scylla LWT per fresh commit <= 4 (all streams: with contention retries)",
                "scylla",
                scylla.cost("fresh", "lwt"),
                "<=",
                4,
            )
        )
        checks.append(
            _check("scylla LWT per replay == 0", "scylla", scylla.cost("replay", "lwt"), "<=", 0)
        )
    for name, report in reports.items():
        ratios = report.ratios()
        checks.append(
            _check(
                f"{name} replay/s >= 2 x fresh/s",
                name,
                ratios["replay_over_fresh"],
                ">=",
                2.0,
                report.cpu_ratios()["replay_over_fresh"],
            )
        )
        checks.append(
            _check(f"{name} fresh p99 <= 3 x p50", name, ratios["p99_over_p50"], "<=", 3.0)
        )
        if "big" in report.phases:
            checks.append(
                _check(
                    f"{name} big commits/s >= 0.8 x fresh (members: any number)",
                    name,
                    ratios["big_over_fresh"],
                    ">=",
                    0.8,
                    cpu_ratio(report.phases.get("big"), report.phases.get("fresh")),
                )
            )
        sizes = report.footprint or {}
        small, big = sizes.get("fresh", {}), sizes.get("big", {})
        grown = None
        if isinstance(small.get("intent_bytes"), int) and isinstance(big.get("intent_bytes"), int):
            grown = float(big["intent_bytes"] or 0) - float(small["intent_bytes"] or 0)
        checks.append(
            _check(
                f"{name} bytes per unfinished intent, big minus small conversation <= 16",
                name,
                grown,
                "<=",
                16,
            )
        )
    if redis is not None:
        size = (redis.redis_record or {}).get("memory_usage_bytes")
        checks.append(
            _check(
                "redis committed record <= 400 B",
                "redis",
                float(size) if isinstance(size, int | float) else None,
                "<=",
                400,
            )
        )
    return checks


def targets_text(checks: Sequence[TargetCheck]) -> list[str]:
    lines = ["targets:"]
    for c in checks:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[c.passed]
        lines.append(
            f"  [{verdict}] {c.name}: measured {num(c.value, '{:.3f}')}"
            f" (bound {c.comparison} {c.bound:g})"
            + (f"; from CPU per op {c.cpu_estimate:.3f}" if c.cpu_estimate is not None else "")
        )
    return lines
