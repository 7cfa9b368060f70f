"""The nemesis cannot pass on faults that never happened: a fault whose start failed
is not counted as fired (and fails the run), and a run that cannot create its
conversations stops instead of sending commits that can only be refused."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from toolkit.nemesis import cli
from toolkit.nemesis.history import HistoryWriter, fault_counts
from toolkit.nemesis.replicas import Replica
from toolkit.nemesis.schedule import Fault
from toolkit.ports import free_port


class _Topology:
    """Storage faults whose start fails on target 1 only."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, int]] = []

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


async def test_conversations_that_cannot_be_created_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # a port nothing listens on
    monkeypatch.setattr(cli, "CREATE_TRIES", 2)
    nemesis = _nemesis(tmp_path)
    nemesis.replicas = [cast(Replica, SimpleNamespace(target=f"127.0.0.1:{port}"))]
    with pytest.raises(cli.NemesisError, match="could not be created in 2 tries"):
        await nemesis.create_conversations("t")
