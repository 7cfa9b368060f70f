"""CI's smoke of the mutation campaigns: the most important mutants (Python,
Lua, CQL), each killed by a targeted test selection (docs/mutation.md has the
full campaigns).

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


# No baseline run of its own (a subprocess that migrates a keyspace: 40 s of the CQL
# worker): the selection is tests/scylla/test_races.py, which the suite runs on the same
# node, and the harness's baseline is test_the_selections_pass_without_a_mutant.
CQL_CASES: dict[str, tuple[str, ...]] = {
    # the CQL node of the session (a conditional write that loses a race)
    "scylla-if-outboxed-any-state": (
        "tests/scylla/test_races.py::test_a_publish_mark_that_loses_to_a_commit_leaves_the_commit[same-publication]",
    ),
}  # fmt: skip


def _env(**servers: str) -> dict[str, str]:
    return {**os.environ, **servers}


def _cql(contact: tuple[str, int]) -> dict[str, str]:
    return _env(MC_TEST_CQL_CONTACT=f"{contact[0]}:{contact[1]}")


def _assert_baseline(cases: dict[str, tuple[str, ...]], env: dict[str, str]) -> None:
    selection = sorted({test for tests in cases.values() for test in tests})
    passed, tail = baseline(selection, env, timeout_s=600)
    assert passed, tail
    assert f"{len(selection)} passed" in tail


def _assert_killed(mutant_id: str, cases: dict[str, tuple[str, ...]], env: dict[str, str]) -> None:
    outcome = run_one(BY_ID[mutant_id], cases[mutant_id], env, timeout_s=300)
    assert outcome.verdict == "killed", outcome
    assert outcome.killer in cases[mutant_id], outcome


def test_the_selections_pass_without_a_mutant(redis_url: str) -> None:
    _assert_baseline(CASES, _env(MC_TEST_REDIS_URL=redis_url))


@pytest.mark.parametrize("mutant_id", sorted(CASES))
def test_the_mutant_is_killed(mutant_id: str, redis_url: str) -> None:
    _assert_killed(mutant_id, CASES, _env(MC_TEST_REDIS_URL=redis_url))


@pytest.mark.scylla
@pytest.mark.parametrize("mutant_id", sorted(CQL_CASES))
def test_the_cql_mutant_is_killed(mutant_id: str, cql_contact: tuple[str, int]) -> None:
    _assert_killed(mutant_id, CQL_CASES, _cql(cql_contact))
