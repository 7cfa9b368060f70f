"""The nemesis cannot pass on faults that never happened: a fault whose start failed
is not counted as fired (and fails the run), a fault whose effect was not observed is
not counted as proven (and fails the run), and a run that cannot create its
conversations stops instead of sending commits that can only be refused."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from toolkit.nemesis import cli
from toolkit.nemesis.history import HistoryWriter, fault_counts, read_lines
from toolkit.nemesis.proof import Proof, default_min_acks, overrun_s, quorum_lost_seconds
from toolkit.nemesis.replicas import Replica
from toolkit.nemesis.schedule import Fault
from toolkit.ports import free_port


class _Topology:
    """Storage faults whose start fails on target 1 only."""

    def __init__(self, effect: bool = True) -> None:
        self.ended: list[tuple[str, int]] = []
        self.effect = effect

    def prove_begin(self, kind: str, target: int) -> Proof:
        return Proof(self.effect, "seen" if self.effect else "nothing seen")

    def prove_end(self, kind: str, target: int) -> Proof | None:
        return None

    async def begin(self, kind: str, target: int) -> None:
        if target == 1:
            raise RuntimeError("the node would not stop")

    async def end(self, kind: str, target: int) -> None:
        self.ended.append((kind, target))


def _nemesis(tmp_path: Path) -> cli.Nemesis:
    return cli.Nemesis(argparse.Namespace(conversations=2), tmp_path)


async def test_a_fault_that_could_not_start_is_failed_not_fired(tmp_path: Path) -> None:
    nemesis = _nemesis(tmp_path)
    topology = _Topology()
    nemesis.topology = cast(Any, topology)
    history = HistoryWriter(tmp_path / "h.jsonl")
    await nemesis.apply(Fault("pause-node", (0,), 0.0, 0.01), history)
    await nemesis.apply(Fault("kill-node", (0, 1), 0.0, 0.01), history)
    history.close()
    assert nemesis.fired == {"pause-node": 1}
    assert nemesis.failed == {"kill-node": 1}
    assert fault_counts(tmp_path / "h.jsonl") == {"pause-node": 1, "kill-node": 1}
    assert topology.ended == [("pause-node", 0), ("kill-node", 0), ("kill-node", 1)]
    assert nemesis.proven == {"pause-node": 1, "kill-node": 1}  # target 0 of it was seen


async def test_a_fault_without_observed_effect_is_unproven(tmp_path: Path) -> None:
    nemesis = _nemesis(tmp_path)
    nemesis.topology = cast(Any, _Topology(effect=False))
    history = HistoryWriter(tmp_path / "h.jsonl")
    await nemesis.apply(Fault("timeout", (0,), 0.0, 0.01), history)
    history.close()
    assert nemesis.fired == {"timeout": 1}
    assert nemesis.unproven == {"timeout": 1} and not nemesis.proven
    phases = [line.get("phase") for line in read_lines(tmp_path / "h.jsonl")]
    assert phases == ["start", "no-effect", "end"]


async def test_conversations_that_cannot_be_created_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # a port nothing listens on
    monkeypatch.setattr(cli, "CREATE_TRIES", 2)
    nemesis = _nemesis(tmp_path)
    nemesis.replicas = [cast(Replica, SimpleNamespace(target=f"127.0.0.1:{port}"))]
    with pytest.raises(cli.NemesisError, match="could not be created in 2 tries"):
        await nemesis.create_conversations("t")


class _NemesisWhoseStorageWillNotHeal:
    """Two schedules pass; the third raises as a CQL node that never came back does."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.fired: dict[str, int] = {"kill-node": 3}
        self.proven: dict[str, int] = {"kill-node": 2}
        self.events: dict[str, int] = {}
        self.unsupported: list[str] = []
        self.skipped = 0
        self.failed: dict[str, int] = {}
        self.failures: list[str] = []
        self.closed = False
        self.schedules = 0

    async def start(self) -> None:
        return None

    async def schedule(self, seed: int) -> tuple[int, int]:
        self.schedules += 1
        if self.schedules == 3:
            raise RuntimeError("Cassandra was not ready within 240s")
        return 0, 0

    def close(self) -> None:
        self.closed = True


async def test_storage_that_will_not_heal_fails_the_run_with_its_figures_instead_of_a_crash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 3-node run of 2026-12-04 ended in a traceback after 11 schedules when a node
    took more than the launcher's 240 s to restart: no summary, no anomaly line."""
    made: list[_NemesisWhoseStorageWillNotHeal] = []

    def make(args: argparse.Namespace, work: Path) -> _NemesisWhoseStorageWillNotHeal:
        made.append(_NemesisWhoseStorageWillNotHeal(args, work))
        return made[-1]

    monkeypatch.setattr(cli, "Nemesis", make)
    args = argparse.Namespace(system="commits", schedules=5, seed=100)
    own, por, unproven = await cli._run(args, Path("."))
    out = capsys.readouterr().out
    assert (own, por, unproven) == (0, 0, 1) and made[0].closed
    assert "faults fired over 2 schedule(s): kill-node x3" in out
    assert "FAILED: schedule seed 102 could not finish, the run stopped after 2" in out


def test_seconds_without_a_majority_count_only_overlaps_of_a_majority_of_nodes() -> None:
    # three nodes: 0 down 10-40, 1 down 30-50, 2 down 45-70 (restarts included)
    outages = [(0, 10.0, 40.0), (1, 30.0, 50.0), (2, 45.0, 70.0)]
    assert quorum_lost_seconds(outages, 3, 0.0, 100.0) == 15.0  # 30-40 and 45-50
    assert quorum_lost_seconds(outages, 3, 35.0, 48.0) == 8.0  # clipped to the load
    assert quorum_lost_seconds([(0, 5.0, 9.0), (0, 20.0, 25.0)], 1, 0.0, 30.0) == 9.0
    assert quorum_lost_seconds([(0, 10.0, 20.0), (0, 15.0, 30.0)], 3, 0.0, 40.0) == 0.0


def test_the_ack_floor_owes_nothing_for_seconds_without_a_majority() -> None:
    assert default_min_acks(60) == 60
    assert default_min_acks(60, quorum_lost_s=45.5) == 14
    assert default_min_acks(60, quorum_lost_s=59) == 10  # never under 10


def test_the_overrun_leaves_room_for_every_restart_of_the_schedule() -> None:
    assert overrun_s(60, restarting_s=0, minimum_s=60) == 60
    assert overrun_s(20, restarting_s=0, minimum_s=60) == 60
    assert overrun_s(60, restarting_s=3 * 150 + 2 * 120, minimum_s=60) == 690
