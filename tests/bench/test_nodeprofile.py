"""The node profile's arithmetic, on hand-made samples (the JFR parsing itself is the
JDK's ``jfr`` tool; its JSON shape is what these samples imitate)."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.bench.nodeprofile import OTHER, categorise, main, report


def _sample(thread: str, *frames: str) -> dict[str, Any]:
    def frame(name: str) -> dict[str, Any]:
        cls, method = name.rsplit(".", 1)
        return {"method": {"type": {"name": "org/apache/cassandra/" + cls}, "name": method}}

    return {
        "values": {
            "sampledThread": {"javaName": thread},
            "stackTrace": {"frames": [frame(f) for f in frames]},
        }
    }


def test_a_sample_goes_to_the_first_category_that_matches() -> None:
    counts = categorise(
        [
            _sample("CompactionExecutor:1", "SSTableWriter.append"),
            # a Paxos commit's write to system.paxos is Paxos state, not "the rest"
            _sample(
                "MutationStage-3",
                "SkipListMemtable.put",
                "SystemKeyspace.savePaxosCommit",
                "PaxosState.applyCommit",
            ),
            _sample("MutationStage-4", "SkipListMemtable.put", "PaxosState.applyCommit"),
            _sample(
                "Native-Transport-Requests-1",
                "SinglePartitionReadCommand.execute",
                "PaxosPrepare.start",
            ),
            _sample("MutationStage-5", "Mutation.apply"),
            _sample("GossipTasks:1", "Gossiper.run"),
        ]
    )
    assert counts == {
        "compaction": 1,
        "paxos state (system.paxos and its index)": 1,
        "paxos commit: the data applied": 1,
        "reads (conditions and plain)": 1,
        "plain writes applied": 1,
        OTHER: 1,
    }


def test_figures_in_floors_divide_samples_per_op_by_the_floors() -> None:
    compaction, write = _sample("CompactionExecutor:1"), _sample("x", "Mutation.apply")
    load = categorise([compaction] * 30 + [write] * 10)
    floor = categorise([compaction] * 10)
    lines = report(load, ops=4, floor=floor, floor_ops=10)  # 10 per op against 1 per op
    assert lines[0] == "40 samples, 10.0000 per op"
    assert lines[1] == "the floor: 1.0000 samples per op; this load: 10.00 floors per op"
    assert lines[2] == " 75.0 %  compaction  (7.50 floors; the floor's own: 1.00)"
    assert lines[3] == " 25.0 %  plain writes applied  (2.50 floors; the floor's own: 0.00)"


def test_an_empty_recording_says_so() -> None:
    assert "no execution samples" in report(categorise([]))[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["x.jfr", "--floor", "f.jfr"], "--floor and --floor-ops go together"),
        (["x.jfr", "--ops", "0"], "--ops must be a positive count"),
    ],
)
def test_bad_arguments_are_refused_before_reading_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
