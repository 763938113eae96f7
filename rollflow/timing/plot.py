"""The timeline picture: roles as rows, states as colours, versions marked, cores and servers below.

What it is: ``plot_timeline(doc, path)`` draws a ``Timeline.document()`` (or the ``timeline.json``
artifact read back) into a PNG (a bare matplotlib ``Figure``, so the caller's pyplot backend is left alone): the upper panel has one row per role
(trainer, rollout, weights, eval) with each state span coloured and the share of each state in the legend;
thin ticks on top mark every policy version (every k-th label); the lower panel plots each core's busy
share and each server's busy share over time, from the periodic samples. ``window`` draws a slice
(``(t0, t1)`` seconds) to see single steps.
What it is not: a live view (the notebook re-reads the artifact) nor the accounting itself (``rollflow.clock.roles``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROW_ORDER = ("trainer", "rollout", "weights", "eval")
COLOURS = {
    "computing": "#2b7bba",
    "generating": "#2ca25f",
    "loading": "#e6550d",
    "fetching": "#fdd0a2",
    "updating": "#fdae6b",
    "evaluating": "#756bb1",
    "waiting_data": "#fdae6b",
    "capacity_wait": "#fd8d3c",
    "flush_wait": "#fdd49e",
    "claim_wait": "#fc9272",
    "exhausted": "#d9d9d9",
    "paused": "#e6550d",
    "publishing": "#9ecae1",
    "other": "#bdbdbd",
    "idle": "#f0f0f0",
    "waiting": "#f0f0f0",
}


def plot_timeline(
    doc: dict[str, Any], path: str | Path, *, window: tuple[float, float] | None = None
) -> Path:
    """Write the picture of ``doc`` to ``path`` (PNG); returns the path."""
    from matplotlib.figure import Figure  # not pyplot: a notebook's inline backend must stay as it is
    from matplotlib.patches import Patch

    roles = doc.get("roles", {})
    names = [r for r in ROW_ORDER if r in roles] + sorted(r for r in roles if r not in ROW_ORDER)
    t_end = float(doc.get("duration_s", 0.0)) or 1.0
    lo, hi = window if window is not None else (0.0, t_end)
    fig = Figure(figsize=(11, 1.0 + 0.7 * len(names) + 2.4))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[max(1, len(names)), 2.2])
    legend: dict[str, Patch] = {}
    for row, name in enumerate(reversed(names)):
        info = roles[name]
        by_state: dict[str, list[tuple[float, float]]] = {}
        for t0, t1, state in info.get("spans", []):
            if t1 < lo or t0 > hi:
                continue
            by_state.setdefault(state, []).append((t0, t1 - t0))
        for state, bars in by_state.items():
            colour = COLOURS.get(state, "#969696")
            top.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour, edgecolors="none")
        for state, frac in info.get("fractions", {}).items():
            if frac >= 0.005:
                label = f"{name}: {state} {frac:.0%}"
                legend[label] = Patch(facecolor=COLOURS.get(state, "#969696"), label=label)
    top.set_yticks(range(len(names)), list(reversed(names)))
    top.set_ylim(-0.6, len(names) - 0.4)
    versions = [(t, v) for t, v in doc.get("versions", []) if lo <= t <= hi]
    if versions:
        every = max(1, len(versions) // 12)
        for i, (t, v) in enumerate(versions):
            top.axvline(t, color="black", lw=0.3, alpha=0.35)
            if i % every == 0:
                top.text(t, len(names) - 0.45, f"v{v}", fontsize=7, ha="left", va="bottom")
    top.legend(handles=list(legend.values()), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_title(
        "where the time goes: roles (rows) in states (colours); ticks = policy versions", fontsize=9
    )

    samples = [s for s in doc.get("samples", []) if lo <= float(s.get("t", 0.0)) <= hi]
    ts = [float(s["t"]) for s in samples]
    cores = sorted({c for s in samples for c in s.get("cores", {})}, key=int)
    for c in cores:
        bottom.plot(
            ts, [100 * s.get("cores", {}).get(c, float("nan")) for s in samples], lw=1, label=f"core {c}"
        )
    servers = sorted({a for s in samples for a in s.get("servers", {})})
    for j, a in enumerate(servers):
        ys = [100 * s.get("servers", {}).get(a, {}).get("busy_frac", float("nan")) for s in samples]
        bottom.plot(ts, ys, lw=1, ls="--", label=f"server {j} engine")
    if not samples:
        bottom.text(0.5, 0.5, "no core / server sample in this window (one every few seconds)",
                    transform=bottom.transAxes, ha="center", va="center", fontsize=8, color="#636363")  # fmt: skip
    bottom.set_ylim(0, 105)
    bottom.set_ylabel("busy %")
    bottom.set_xlabel("seconds since the run started")
    bottom.set_xlim(lo, hi)
    if cores or servers:
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
