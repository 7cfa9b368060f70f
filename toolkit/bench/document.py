"""The ``--json`` document: the run's settings, the machine, every backend's report
and the target checks, under one schema name (``SCHEMA``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from toolkit.bench.report import BackendReport
from toolkit.bench.targets import TargetCheck

SCHEMA = "message-committer-bench/1"


def to_json(
    settings: dict[str, Any],
    reports: dict[str, BackendReport],
    checks: Sequence[TargetCheck],
    machine_info: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "machine": machine_info,
        "settings": settings,
        "backends": {
            name: {
                "backend": r.backend,
                "server": r.server,
                "phases": {k: dataclasses.asdict(p) for k, p in r.phases.items()},
                "ratios": r.ratios(),
                "cpu_ratios": r.cpu_ratios(),
                "redis_record": r.redis_record,
                "footprint": r.footprint,
                "slope": dataclasses.asdict(r.slope) if r.slope is not None else None,
                "notes": r.notes,
            }
            for name, r in reports.items()
        },
        "targets": [dataclasses.asdict(c) for c in checks],
    }
