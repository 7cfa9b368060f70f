"""Seeded fault scenarios on every backend, plus a property test on memory."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.memory import open_memory_backend
from tests.conformance.harness import Harness
from toolkit.campaign.scenario import run_scenario

SEEDS = [1, 2, 3, 5, 8, 13]


async def test_seeded_scenarios_keep_every_invariant(harness: Harness) -> None:
    backend = await harness.open()
    fired: set[str] = set()
    for seed in SEEDS:
        result = await run_scenario(backend, seed)
        assert result.ok, "\n".join(result.violations)
        fired |= set(result.fired)
    assert any(k.startswith("crash") for k in fired)
    assert any(k.startswith("call") for k in fired)


@pytest.mark.memory
@settings(max_examples=150, deadline=None, derandomize=False, print_blob=True)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_random_interleavings_keep_every_invariant_on_memory(seed: int) -> None:
    result = asyncio.run(run_scenario(open_memory_backend(), seed))
    assert result.ok, f"replay with seed={seed}:\n" + "\n".join(result.violations)
