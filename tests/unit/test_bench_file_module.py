"""The bench loads the CQL launcher from its file; a module with dataclasses must load."""

from __future__ import annotations

from pathlib import Path

from toolkit.bench.environment import CASSANDRA_LAUNCHER, _load_file_module


def test_a_file_module_with_dataclasses_loads(tmp_path: Path) -> None:
    path = tmp_path / "launcher.py"
    path.write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n\n"
        "@dataclass(frozen=True)\nclass Node:\n    port: int = 1\n"
    )
    module = _load_file_module("mc_test_file_module", path)
    assert module.Node().port == 1


def test_the_cql_launcher_itself_loads() -> None:
    module = _load_file_module("mc_test_cassandra_node", CASSANDRA_LAUNCHER)
    assert hasattr(module, "CassandraNode")
