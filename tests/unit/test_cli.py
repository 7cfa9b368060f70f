"""The command line: its commands, delegated commands and the serve start-up checks."""

from __future__ import annotations

import sys
import types

import pytest

from service import cli


def test_every_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "conversation", "send", "history", "resume", "recover", "health"):
        assert f"    {command} " in out
    for command in cli.DELEGATED:
        assert command in out


def test_a_delegated_command_is_imported_only_when_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    module = types.ModuleType("fake_tool")

    def main(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_tool", module)
    monkeypatch.setitem(cli.DELEGATED, "fake", ("fake_tool", "a fake tool"))
    assert cli.main(["fake", "--flag", "x"]) == 7
    assert seen == [["--flag", "x"]]


def test_a_missing_delegated_command_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.DELEGATED, "absent", ("no_such_module_here", "missing"))
    assert cli.main(["absent"]) == 2
    assert "the absent command is not available" in capsys.readouterr().err


def test_serve_without_a_backend_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MC_BACKEND", raising=False)
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err.startswith("message-committer: no backend chosen")


def test_client_commands_need_their_ids() -> None:
    with pytest.raises(SystemExit) as caught:
        cli.build_parser().parse_args(["send", "--tenant", "t"])
    assert caught.value.code == 2


@pytest.mark.parametrize("command", ["serve", "conversation", "send", "history", "recover"])
def test_every_help_page_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_relay_refuses_memory_and_a_missing_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MC_BACKEND", raising=False)
    assert cli.main(["relay", "--backend", "memory"]) == 2
    assert "its relay runs inside serve" in capsys.readouterr().err
    assert cli.main(["relay"]) == 2
    assert "no backend chosen" in capsys.readouterr().err


def test_the_relay_help_renders(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["relay", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--relay-lease" in out and "--fanout-threshold" in out


def test_migrate_help_shows_both_backends_and_their_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from backends import migrate

    assert migrate.main(["--help"]) == 0
    out = capsys.readouterr().out
    for needle in (
        "--backend scylla",
        "--contact-points",
        "--keyspace",
        "--backend redis",
        "--prefix",
        "--shards",
        "MC_REDIS_URL",
    ):
        assert needle in out, needle
