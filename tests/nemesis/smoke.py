"""What every clean nemesis smoke checks of its run."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from tests.e2e.process import run_cli_bounded


def clean_run(args: Sequence[str], kinds: Sequence[str], label: str) -> str:
    """Run ``nemesis ARGS --faults KINDS`` and check it ended clean: exit 0, no FAILED
    line, 0 anomalies in both checkers, every kind proven. Returns its output."""
    began = time.monotonic()
    result = run_cli_bounded(["nemesis", *args, "--faults", ",".join(kinds)], timeout=300)
    print(result.stdout[-3000:])
    print(f"{label} took {time.monotonic() - began:.1f}s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "anomalies: 0 (checker), 0 (porcupine)"
    assert "FAILED" not in result.stdout
    proven = next(line for line in lines if line.startswith("faults proven over"))
    for kind in kinds:
        assert re.search(rf"\b{kind} x\d+", proven), proven
    return result.stdout
