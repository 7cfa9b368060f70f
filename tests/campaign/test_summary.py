"""``fault-campaign --summary`` and the reusable summary writer (toolkit.summary)."""

from __future__ import annotations

import argparse
import html
from collections import Counter
from pathlib import Path

import pytest

from toolkit.campaign.cli import INVARIANTS, main, summarise
from toolkit.summary import SummaryError, summary_from_mapping, to_html, write_summary

SEEDS = 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fired_table(out: str) -> dict[str, int]:
    table = out.split("faults fired:\n", 1)[1].split("summary written")[0]
    rows = [line.rsplit(None, 1) for line in table.strip().splitlines()]
    return {kind.strip(): int(n) for kind, n in rows}


def test_the_html_summary_shows_what_fired_and_what_was_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "campaign.html"
    code = main(["--backend", "memory", "--seeds", str(SEEDS), "--summary", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "0 violations" in page
    fired = _fired_table(out)
    assert fired, out
    for kind, count in fired.items():
        assert f'<td>{html.escape(kind)}</td><td class="n">{count}</td>' in page, kind
    for text in INVARIANTS.values():
        assert html.escape(text) in page
    assert f"0..{SEEDS - 1} ({SEEDS})" in page
    assert "<script" not in page and "http" not in page  # self-contained, nothing fetched


def test_the_png_summary_is_a_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "campaign.png"
    assert main(["--backend", "memory", "--seeds", "5", "--summary", str(path)]) == 0
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert "summary written to" in capsys.readouterr().out


def test_violations_are_counted_per_invariant_and_their_seeds_listed() -> None:
    args = argparse.Namespace(backend="redis", first_seed=10, seeds=5, steps=None)
    lines = [
        "seed 11: 3: t/u/c got different ACKs",
        "seed 11: 1: t/u/c is not in the outbox",
        "seed 13: 3: t/u/d got different ACKs",
        "something unexpected",
    ]
    summary = summarise(args, Counter({"crash M-COMMIT-04": 2}), lines, 40, 1.5)
    counts = {c.name[:2]: c.violations for c in summary.checks}
    assert (counts["1."], counts["3."], counts["2."]) == (1, 2, 0)
    assert summary.total_violations == 4
    assert list(summary.failing) == ["seed 11", "seed 13", "?"]
    page = to_html(summary)
    assert "4 violations" in page and "seed 11, seed 13" in page


def test_plain_data_of_the_documented_shape_is_accepted_and_escaped(tmp_path: Path) -> None:
    summary = summary_from_mapping(
        {
            "title": "nemesis <on> redis",
            "facts": {"nodes": 3},
            "fired": {"kill -9 <service>": 4, "partition": 0},
            "checks": [{"name": "acks stable", "violations": 0}, {"name": "no loss"}],
            "violations": [],
        }
    )
    write_summary(summary, tmp_path / "nemesis.html")
    page = (tmp_path / "nemesis.html").read_text()
    assert "kill -9 &lt;service&gt;" in page and "<service>" not in page
    assert "nemesis &lt;on&gt; redis" in page and "0 violations" in page
    write_summary(summary, tmp_path / "nemesis.png")
    assert (tmp_path / "nemesis.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    "data",
    [
        {"title": "x", "checks": []},  # no "fired"
        {"title": "x", "fired": {"a": "many"}, "checks": []},
        {"title": "x", "fired": {"a": -1}, "checks": []},
        {"title": "x", "fired": {}, "checks": [{"violations": 1}]},  # a check without a name
    ],
)
def test_data_of_another_shape_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(SummaryError):
        summary_from_mapping(data)


def test_an_unknown_summary_format_is_refused(tmp_path: Path) -> None:
    summary = summary_from_mapping({"title": "x", "fired": {}, "checks": []})
    with pytest.raises(SummaryError, match=r"FILE\.html or FILE\.png"):
        write_summary(summary, tmp_path / "summary.pdf")
    with pytest.raises(SystemExit):
        main(["--backend", "memory", "--seeds", "1", "--summary", str(tmp_path / "s.txt")])
