"""The fault-campaign command as CI runs it: memory in depth, real backends shallower.

Each run goes through the real command (``main``), so its exit code, its
fired-fault table and its last line are what is checked.
"""

from __future__ import annotations

import os

import pytest

from toolkit.campaign.cli import main

MEMORY_SEEDS = int(os.environ.get("MC_TEST_MEMORY_CAMPAIGN_SEEDS", "300"))
"""300 in CI; the mutation run (docs/mutation.md) lowers it to keep each mutant's run short."""
REDIS_SEEDS = 40
SCYLLA_SEEDS = 8


def _verdict(out: str) -> int:
    last = out.strip().splitlines()[-1]
    assert last.startswith("invariant violations: "), last
    return int(last.rsplit(" ", 1)[1])


def _fired(out: str) -> set[str]:
    table = out.split("faults fired:\n", 1)[1].split("invariant violations")[0]
    return {line.rsplit(None, 1)[0].strip() for line in table.strip().splitlines()}


def test_memory_campaign(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--backend", "memory", "--seeds", str(MEMORY_SEEDS)])
    out = capsys.readouterr().out
    assert (code, _verdict(out)) == (0, 0), out
    fired = _fired(out)
    for point in ("01", "02", "03", "04", "06"):
        assert f"crash M-COMMIT-{point}" in fired
    for call in ("reserve", "put_record", "mark_published_and_committed", "publish"):
        assert any(k.startswith(f"call {call} ") for k in fired), call
    assert {"call reserve fail", "call reserve lose_reply", "call reserve hang"} <= fired
    assert "recovery run" in fired and "error IdempotencyConflict" in fired
    for bad_day in (
        "bad day: poison intent",
        "bad day: send via a skewed replica",
        "bad day: retention passed unfinished intents",
        "quarantined",
        "operator retried a quarantined intent",
        "check: an outsider's history read refused",
        "call put_record refuse",
    ):
        assert bad_day in fired, bad_day


@pytest.mark.redis
def test_redis_campaign(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--backend", "redis", "--seeds", str(REDIS_SEEDS), "--redis-url", redis_url])
    out = capsys.readouterr().out
    assert (code, _verdict(out)) == (0, 0), out
    fired = _fired(out)
    for point in ("01", "02", "03", "04", "06"):
        assert f"crash M-COMMIT-{point}" in fired
    # a fresh commit's last steps go in one pipeline; an armed point splits it
    for steps in (1, 2, 3):
        assert f"pipelined commit, {steps} of 3 steps" in fired
    for bad_day in (
        "bad day: eviction policy refused",
        "bad day: lost deployment identity refused",
    ):
        assert bad_day in fired, bad_day


@pytest.mark.scylla
def test_scylla_campaign(
    cql_contact: tuple[str, int], cql_keyspace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host, port = cql_contact
    code = main(
        [
            "--backend",
            "scylla",
            "--seeds",
            str(SCYLLA_SEEDS),
            "--steps",
            "15",
            "--scylla-contact-points",
            host,
            "--scylla-port",
            str(port),
            "--scylla-keyspace",
            cql_keyspace,
        ]
    )
    out = capsys.readouterr().out
    assert (code, _verdict(out)) == (0, 0), out
    assert "crash M-COMMIT-05" in _fired(out)  # the two-step path's own gap


def test_a_replayed_seed_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--backend", "memory", "--seeds", "1", "--first-seed", "4242"])
    first = capsys.readouterr().out.split("faults fired:")[1]
    main(["--backend", "memory", "--seeds", "1", "--first-seed", "4242"])
    assert capsys.readouterr().out.split("faults fired:")[1] == first
