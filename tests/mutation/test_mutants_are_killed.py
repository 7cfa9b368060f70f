"""CI's smoke of the mutation campaigns: the most important mutants, each killed
by a targeted test selection (docs/mutation.md has the full campaigns).

Each case runs pytest in a fresh process with one mutant applied
(``tests.mutation.plugin``) on the few tests that must kill it; the same
selection is first run once without any mutant, so a kill is the mutant's
doing, not a broken test.
"""

from __future__ import annotations

import os

import pytest

from tests.mutation.catalogue import BY_ID
from tests.mutation.run import baseline, run_one

pytestmark = pytest.mark.slow

CASES: dict[str, tuple[str, ...]] = {
    # domain and memory backend (the behavioural spec)
    "memory-reserve-no-identity-compare": (
        "tests/conformance/test_reserve.py::test_a_key_reused_with_a_different_request_is_a_conflict[memory-body]",
    ),
    "memory-reserve-seq-before-exists": (
        "tests/conformance/test_reserve.py::test_repeated_reserve_returns_first_coordinates_and_consumes_nothing[memory]",
    ),
    "memory-reserve-no-queue-entry": (
        "tests/conformance/test_faults.py::test_recover_due_leaves_young_intents_and_honours_the_batch_size[memory]",
    ),
    "memory-history-no-member-check": (
        "tests/conformance/test_history.py::test_non_members_and_unknown_conversations_cannot_read[memory]",
    ),
    "drive-store-error-acks": (
        "tests/conformance/test_faults.py::test_a_store_that_refuses_mid_commit_is_never_turned_into_an_ack[memory-put_record]",
    ),
    # Lua scripts on a real redis-server
    "lua-prologue-no-identity-guard": (
        "tests/redis/test_wiped.py::test_every_script_refuses_a_shard_without_the_deployment_identity[replaced]",
    ),
    "lua-reserve-seq-before-exists": (
        "tests/conformance/test_reserve.py::test_repeated_reserve_returns_first_coordinates_and_consumes_nothing[redis]",
    ),
    "lua-reserve-no-queue-entry": (
        "tests/conformance/test_faults.py::test_recover_due_leaves_young_intents_and_honours_the_batch_size[redis]",
    ),
    "lua-history-no-member-check": (
        "tests/conformance/test_history.py::test_non_members_and_unknown_conversations_cannot_read[redis]",
    ),
    "lua-publish-no-publication-compare": (
        "tests/conformance/test_transitions.py::test_a_different_publication_is_refused_and_leaves_the_first[redis]",
    ),
    "lua-commit-no-record-check": (
        "tests/redis/test_layout.py::test_refused_transitions_leave_every_key_as_it_was",
    ),
}  # fmt: skip


def _env(redis_url: str) -> dict[str, str]:
    return {**os.environ, "MC_TEST_REDIS_URL": redis_url}


def test_the_selections_pass_without_a_mutant(redis_url: str) -> None:
    selection = sorted({test for tests in CASES.values() for test in tests})
    passed, tail = baseline(selection, _env(redis_url), timeout_s=600)
    assert passed, tail
    assert f"{len(selection)} passed" in tail


@pytest.mark.parametrize("mutant_id", sorted(CASES))
def test_the_mutant_is_killed(mutant_id: str, redis_url: str) -> None:
    outcome = run_one(BY_ID[mutant_id], CASES[mutant_id], _env(redis_url), timeout_s=300)
    assert outcome.verdict == "killed", outcome
    assert outcome.killer in CASES[mutant_id], outcome
