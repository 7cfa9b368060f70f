"""A short smoke of the client campaign (the full one is a command that prints figures:
``message-committer client-campaign --seeds 500``)."""

from __future__ import annotations

import pytest

from toolkit.client_campaign import cli

pytestmark = pytest.mark.e2e


def test_a_few_seeds_lose_and_duplicate_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--seeds", "3", "--parallel", "3", "--settle", "30", "--seed-timeout", "90"])
    out = capsys.readouterr().out
    assert "lost: 0  duplicated: 0  phantom: 0  stuck seeds: 0" in out, out
    assert "client crashes by point:" in out and "server kills:" in out
    assert code == 0, out
