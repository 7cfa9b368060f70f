"""The pure parts of the bad-days A/B (``scripts/ab-bad-days.sh``, ``tests/ab``):
the fake-ACK mutation still finds its branch in this tree's committer, and the
table keeps one row per probe with its evidence.

The command itself starts servers of two trees and runs for minutes, so it is a
campaign-style command, not part of CI; these checks keep it from rotting.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.ab.bad_days import PROBES, Verdict, print_table
from tests.ab.mutation import mutate
from tests.ab.parts import ProbeError

COMMITTER = Path(__file__).resolve().parents[2] / "service" / "domain" / "committer.py"


def test_the_fake_ack_mutation_replaces_exactly_the_refused_store_branch_of_drive() -> None:
    source = COMMITTER.read_text()
    mutated = mutate(source)
    changed = [
        line
        for line in difflib.unified_diff(source.splitlines(), mutated.splitlines(), lineterm="")
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert len(changed) == 2, changed
    removed, added = changed
    assert removed.startswith("-") and "raise self._recoverable(" in removed
    assert '"store refused"' in removed
    assert added[1:].strip() == "return intent.committed_message()  # MUTANT: fake ACK"
    indent = len(removed[1:]) - len(removed[1:].lstrip())
    assert len(added[1:]) - len(added[1:].lstrip()) == indent  # the same block
    compile(mutated, str(COMMITTER), "exec")  # still Python


def test_a_committer_without_that_branch_is_an_error_not_a_silent_no_op() -> None:
    source = "class C:\n    async def _drive(self):\n        return 1\n"
    with pytest.raises(ProbeError):
        mutate(source)
    with pytest.raises(ProbeError):
        mutate("nothing here\n")


def test_the_table_has_a_row_per_probe_with_both_verdicts_and_the_evidence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [(p, Verdict("FAIL", f"old {p.key}", 1.0), Verdict("PASS", f"new {p.key}", 1.0))
            for p in PROBES]  # fmt: skip
    print_table(rows)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(PROBES)
    for probe, line in zip(PROBES, lines[2:], strict=True):
        cells = [c.strip() for c in line.split(" | ")]
        assert cells[:4] == [probe.key, probe.defect, "FAIL", "PASS"]
        assert cells[4] == f"old: old {probe.key} || new: new {probe.key}"
    assert len({p.key for p in PROBES}) == len(PROBES)
