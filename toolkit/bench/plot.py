"""``bench --plot FILE.png``: the figures of one bench result as a picture.

Draws from the bench's own JSON document (what ``--json`` writes, so a saved
result can be drawn again with ``--from-json``), with matplotlib's Agg
backend (no display needed; the ``plot`` extra):

* throughput (ops/s, median of rounds) per phase, one bar per backend;
* latency per phase and backend: p50 (dark) inside p99 (light), in ms;
* with ``--compare-loops``, uvloop/asyncio throughput per phase and backend.

Both throughput and latency use a log scale: the backends differ by 10-20x.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

COLOURS = {"memory": "#4c72b0", "redis": "#c44e52", "scylla": "#55a868"}
OTHER = "#8172b2"


class PlotError(RuntimeError):
    """The figure could not be drawn (no matplotlib, or nothing to draw)."""


def _phases(backends: dict[str, Any]) -> list[str]:
    """Phase names in the order the bench ran them, over all backends."""
    names: list[str] = []
    for result in backends.values():
        for name in result["phases"]:
            if name not in names:
                names.append(name)
    return names


def _bars(
    ax: Any,
    phases: list[str],
    values: dict[str, list[float]],
    *,
    base: float = 0.0,
    labels: Callable[[float], str] | None = None,
    **style: Any,
) -> None:
    """Horizontal bars from ``base``, one group per phase (first phase on top), one
    bar per backend; ``labels`` formats each bar's value at its end."""
    count = max(len(values), 1)
    height = 0.8 / count
    top = len(phases) - 1
    for index, (backend, row) in enumerate(values.items()):
        ys = [top - p - (2 * index - count + 1) * height / 2 for p in range(len(phases))]
        widths = [v - base if v > 0 else 0.0 for v in row]
        colour = COLOURS.get(backend, OTHER)
        ax.barh(ys, widths, left=base, height=height, color=colour, label=backend, **style)
        if labels is not None:
            for y, value in zip(ys, row, strict=True):
                if value > 0:
                    ax.annotate(
                        labels(value),
                        (value, y),
                        xytext=(3, 0),
                        textcoords="offset points",
                        va="center",
                        fontsize="x-small",
                    )
    ax.set_yticks(range(len(phases)), list(reversed(phases)))


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _widen(ax: Any, *values: dict[str, list[float]]) -> None:
    """Log-scale limits with room for the value labels right of the bars."""
    seen = [v for series in values for row in series.values() for v in row if v > 0]
    if seen:
        ax.set_xlim(min(seen) / 2, max(seen) * 4)


def draw(document: dict[str, Any], path: Path) -> None:
    """Write the figure of ``document`` (a bench JSON result) to ``path`` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'message-committer[plot]'") from None
    backends: dict[str, Any] = document.get("backends") or {}
    if not backends:
        raise PlotError("the result has no backend to draw")
    phases = _phases(backends)

    def series(key: str, sub: str | None = None) -> dict[str, list[float]]:
        out = {}
        for name, result in backends.items():
            row = []
            for phase in phases:
                got = result["phases"].get(phase)
                value = 0.0 if got is None else (got[key] if sub is None else got[key][sub])
                row.append(float(value or 0.0))
            out[name] = row
        return out

    loops = document.get("event_loops") or {}
    panels = 3 if loops else 2
    fig, axes = plt.subplots(
        1, panels, figsize=(6.2 * panels, 1.6 + 0.55 * len(phases)), sharey=True, squeeze=False
    )
    tput, lat = axes[0][0], axes[0][1]
    _bars(tput, phases, series("ops_per_s"), labels="{:,.0f}".format)
    tput.set_xscale("log")
    tput.set_xlabel("ops/s (median of rounds, log scale)")
    tput.set_title("throughput")
    _bars(lat, phases, series("latency_ms", "p99"), alpha=0.35)
    _bars(lat, phases, series("latency_ms", "p50"))
    _bars(lat, phases, series("latency_ms", "p99"), alpha=0.0, labels=_ms)
    lat.set_xscale("log")
    lat.set_xlabel("ms (log scale): p50 dark, p99 light")
    lat.set_title("latency")
    _widen(tput, series("ops_per_s"))
    _widen(lat, series("latency_ms", "p99"), series("latency_ms", "p50"))
    handles, labels = tput.get_legend_handles_labels()
    tput.legend(handles, labels, loc="lower right", fontsize="small")
    for ax in (tput, lat):
        ax.grid(axis="x", which="both", alpha=0.25)
    if loops:
        ratio_ax = axes[0][2]
        ratios = {
            name: [float(c["uvloop_over_asyncio"].get(p) or 0.0) for p in phases]
            for name, c in loops.items()
        }
        _bars(ratio_ax, phases, ratios, base=1.0, labels="{:.2f}".format)
        ratio_ax.axvline(1.0, color="black", linewidth=0.8)
        ratio_ax.set_xlabel("uvloop / asyncio throughput (median of per-round ratios)")
        ratio_ax.set_title("server event loop")
        ratio_ax.grid(axis="x", alpha=0.25)
        low = min((v for row in ratios.values() for v in row if v > 0), default=0.9)
        high = max((v for row in ratios.values() for v in row), default=1.1)
        ratio_ax.set_xlim(min(0.9, low - 0.05), max(1.1, high + 0.05))
    machine = document.get("machine") or {}
    settings = document.get("settings") or {}
    fig.suptitle(
        f"message-committer bench: {settings.get('command', '')}\n"
        f"{machine.get('nproc', '?')} CPUs ({machine.get('cpu_model', '')}), "
        f"{settings.get('concurrency', '?')} streams, started {settings.get('started_at', '')}",
        fontsize="medium",
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
