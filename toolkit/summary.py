"""A one-page summary of a fault run: what fired and what was checked, as HTML or PNG.

Written for ``fault-campaign --summary FILE`` and meant for any other tool
that injects faults and then checks invariants (a nemesis). It takes plain
data only, so a caller needs nothing of the campaign:

``RunSummary`` (or ``summary_from_mapping`` of the same shape as a dict)::

    {
      "title": "fault campaign on redis",                 # str
      "facts": {"backend": "redis", "seeds": "0..39",     # ordered str -> str, shown as a table
                "elapsed": "41.2 s", "ACKs checked": "812"},
      "fired": {"crash M-COMMIT-04": 17,                  # what was injected: kind -> times
                "call reserve fail": 9},
      "checks": [                                         # what was checked, in order
        {"name": "1. every ACK in history once, at its seq, and in the outbox",
         "violations": 0},
        ...
      ],
      "violations": ["seed 12: 3: ... got different ACKs"],   # one line each; may be []
      "failing": ["seed 12"]                              # what to replay; may be []
    }

Counts are non-negative ints; every string is escaped (HTML) or drawn as
text (PNG), never interpreted. ``write_summary(summary, path)`` picks the
format from the suffix: ``.html`` (self-contained, no script, no external
resource) or ``.png`` (matplotlib's Agg backend: the ``plot`` extra).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_VIOLATIONS_SHOWN = 200


class SummaryError(ValueError):
    """The summary cannot be written (unknown format, missing matplotlib, bad data)."""


@dataclass(frozen=True)
class Check:
    """One invariant or property that was checked, and how often it failed."""

    name: str
    violations: int = 0


@dataclass(frozen=True)
class RunSummary:
    """What a fault run did and found (see the module docstring for each field)."""

    title: str
    fired: Mapping[str, int]
    checks: Sequence[Check]
    facts: Mapping[str, str] = field(default_factory=dict)
    violations: Sequence[str] = ()
    failing: Sequence[str] = ()

    @property
    def total_violations(self) -> int:
        return sum(c.violations for c in self.checks)


def summary_from_mapping(data: Mapping[str, Any]) -> RunSummary:
    """A RunSummary from plain data of the documented shape; SummaryError if it is not."""
    try:
        fired = {str(k): int(v) for k, v in dict(data["fired"]).items()}
        checks = [Check(str(c["name"]), int(c.get("violations", 0))) for c in data["checks"]]
        summary = RunSummary(
            title=str(data["title"]),
            fired=fired,
            checks=checks,
            facts={str(k): str(v) for k, v in dict(data.get("facts", {})).items()},
            violations=[str(v) for v in data.get("violations", [])],
            failing=[str(s) for s in data.get("failing", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SummaryError(f"not a run summary: {type(exc).__name__} {exc}") from None
    if any(n < 0 for n in summary.fired.values()) or any(c.violations < 0 for c in summary.checks):
        raise SummaryError("counts must not be negative")
    return summary


def write_summary(summary: RunSummary, path: Path) -> None:
    """Write ``summary`` to ``path``: HTML for ``.html``, a picture for ``.png``."""
    suffix = path.suffix.lower()
    if suffix not in (".html", ".png"):
        raise SummaryError("a summary is FILE.html or FILE.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".html":
        path.write_text(to_html(summary), encoding="utf-8")
    else:
        _draw_png(summary, path)


# --- HTML --------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; max-width: 70em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
th { border-bottom: 1px solid #999; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.bar { background: #4c72b0; height: 0.9em; display: inline-block; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c0392b; font-weight: 600; }
.verdict { font-size: 1.2em; padding: 0.4em 0.8em; display: inline-block; border: 2px solid; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def to_html(summary: RunSummary) -> str:
    """The summary as one self-contained HTML page."""
    total = summary.total_violations
    verdict = (
        '<p class="verdict ok">0 violations</p>'
        if total == 0
        else f'<p class="verdict bad">{total} violation{"s" if total != 1 else ""}</p>'
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(summary.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(summary.title)}</h1>",
        verdict,
    ]
    if summary.facts:
        parts.append("<table>")
        parts += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in summary.facts.items()]
        parts.append("</table>")
    parts.append(f"<h2>What fired ({sum(summary.fired.values())} faults)</h2>")
    top = max(summary.fired.values(), default=0) or 1
    parts.append("<table><tr><th>fault</th><th>times</th><th></th></tr>")
    for kind, count in sorted(summary.fired.items(), key=lambda kv: (-kv[1], kv[0])):
        width = max(1, round(300 * count / top)) if count else 0
        parts.append(
            f'<tr><td>{_e(kind)}</td><td class="n">{count}</td>'
            f'<td><span class="bar" style="width:{width}px"></span></td></tr>'
        )
    parts.append("</table>")
    parts.append("<h2>What was checked</h2><table><tr><th>check</th><th>violations</th></tr>")
    for check in summary.checks:
        css = "ok" if check.violations == 0 else "bad"
        parts.append(
            f'<tr><td>{_e(check.name)}</td><td class="n {css}">{check.violations}</td></tr>'
        )
    parts.append("</table>")
    if summary.failing:
        parts.append(f"<h2>To replay</h2><p>{_e(', '.join(summary.failing))}</p>")
    if summary.violations:
        shown = list(summary.violations)[:MAX_VIOLATIONS_SHOWN]
        more = len(summary.violations) - len(shown)
        parts.append("<h2>Violations</h2><pre>" + "\n".join(_e(v) for v in shown) + "</pre>")
        if more:
            parts.append(f"<p>... and {more} more</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --- PNG ---------------------------------------------------------------------------


def _draw_png(summary: RunSummary, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SummaryError(
            "a PNG summary needs matplotlib: pip install 'message-committer[plot]'"
        ) from None
    fired = sorted(summary.fired.items(), key=lambda kv: (kv[1], kv[0]))
    rows = max(len(fired), len(summary.checks), 4)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(15, 1.8 + 0.3 * rows), gridspec_kw={"width_ratios": [1.1, 1]}
    )
    if fired:
        left.barh([k for k, _ in fired], [n for _, n in fired], color="#4c72b0")
        for y, (_, n) in enumerate(fired):
            left.annotate(str(n), (n, y), xytext=(3, 0), textcoords="offset points", va="center")
        left.set_xscale("log")
        left.set_xlim(0.8, max(n for _, n in fired) * 3)
    left.set_title(f"what fired ({sum(summary.fired.values())} faults)")
    left.set_xlabel("times (log scale)")
    left.tick_params(axis="y", labelsize="small")
    right.axis("off")
    right.set_title("what was checked")
    cells = [[c.name, str(c.violations)] for c in summary.checks]
    if cells:
        table = right.table(
            cellText=cells,
            colLabels=["check", "violations"],
            colWidths=[0.85, 0.15],
            loc="upper center",
            cellLoc="left",
        )
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table.scale(1, 1.4)
        for row, check in enumerate(summary.checks, start=1):
            colour = "#d4edda" if check.violations == 0 else "#f8d7da"
            table[row, 1].set_facecolor(colour)
    facts = "   ".join(f"{k}: {v}" for k, v in summary.facts.items())
    total = summary.total_violations
    fig.suptitle(
        f"{summary.title}: {total} violation{'s' if total != 1 else ''}\n{facts}",
        fontsize="medium",
        color="#1a7f37" if total == 0 else "#c0392b",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
