"""The suite's one table and one picture, from each family's ``bench.peer`` results.

What it is: ``load(out, names)`` reads ``<out>/<family>/peer_*.json`` (what ``bench.peer`` wrote for the
family); ``table(docs, times, horizon)`` gives the rows family x system with

* ``base``: the starting policy's held-out accuracy, which is also the share of held-out problems it
  solves (the greedy base run decides the solved / unsolved split);
* ``acc@t``: median held-out accuracy over the seeds at each evaluation time ``t`` (min..max beside it),
  each run read at its snapshot nearest ``t`` (``peer_eval.value_near``; ties: the earlier one), never one
  farther than half the smallest spacing between the marks (0 s counting as a mark: 15 s for 30, 60, 120,
  180 and 240 s); a run with none that near is left out of that median. At the horizon a run's final
  point counts (it stops at the first step end past it);
* ``t_trl_final``: rollflow's median time to TRL's median final accuracy, as a share of the horizon
  (``time_to_trl_final_ratio``; <= 0.5 is the target on half the test families); ``n/a`` when TRL ended
  at or below the base, where any curve "reaches" it at 0 s;
* ``c_to_0.8``: completions generated until held-out 0.8 (median over the runs that got there);
* ``retention``: accuracy at the horizon on the problems the starting policy solved (its start is 1.0 on
  them by construction), median over seeds;
* ``unsolved``: the same on the problems it did not solve (what was learnt); ``compl/s``: completions
  generated per training second; ``cores``: rollflow's least busy core over its run (``time/cpu``);
* ``>= trl``: whether rollflow's median is at or above TRL's at every evaluation time after the first 30 s.

Beside the table, ``key value`` lines only: kept and learnt at the same optimizer step for both systems
(``per_step``: TRL's step count at the horizon) and each system's optimizer steps per second.

``plot(docs, path, horizon)`` draws one panel per family: median accuracy against training seconds per
system, the band min..max over seeds. Both print only what the runs measured.

What it is not: the runner (``bench.suite.run``) or a statistics package.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.peer_eval import mark_window, median, retention_by_step, value_at, value_near

SYSTEMS = ("trl", "rollflow")
COLORS = {"trl": "tab:orange", "rollflow": "tab:blue"}


def load(out: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{family: peer doc}`` for the families that have results under ``out``."""
    docs = {}
    for name in names:
        found = sorted((out / name).glob("peer_*.json"))
        if found:
            docs[name] = json.loads(found[-1].read_text())
    return docs


def _runs(doc: dict[str, Any], system: str) -> list[dict[str, Any]]:
    return [r for r in doc["runs"] if r["system"] == system]


def _at(
    runs: list[dict[str, Any]], t: float, horizon: float, i: int | None = None, *, within: float | None = None
) -> list[float]:
    """Each run's accuracy at ``t`` (``i``: a column of its retention curve instead: 1 solved, 2 unsolved);
    ``within``: the snapshot nearest the mark ``t``, not the last one before it (``value_near``)."""
    final = horizon if t >= horizon else None
    if i is None and within is not None:
        return [value_near(r["curve"], t, within=within, final_from=final) for r in runs]
    if i is None:
        return [value_at(r["curve"], t, final_from=final) for r in runs]
    return [value_at([(p[0], p[i]) for p in r.get("retention", [])], t, final_from=final) for r in runs]


def _fmt(xs: list[float]) -> str:
    finite = [x for x in xs if math.isfinite(x)]
    if not finite:
        return "-"
    m = median(finite)
    return f"{m:.3f}" if len(finite) == 1 else f"{m:.3f} ({min(finite):.2f}..{max(finite):.2f})"


def table(
    docs: dict[str, dict[str, Any]], splits: dict[str, str], times: list[float], horizon: float
) -> tuple[str, dict[str, str]]:
    """The summary table (text) and its ``key value`` figures."""
    head = ["family", "split", "system", "base", *(f"acc@{t:g}s" for t in times)]
    head += ["t_trl_final", "c_to_0.8", "retention", "unsolved", "compl/s", "cores", ">= trl"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    keys: dict[str, str] = {}
    within = mark_window(times)
    for name, doc in docs.items():
        summary = doc.get("summary", {})
        medians = {s: [median(_at(_runs(doc, s), t, horizon, within=within)) for t in times] for s in SYSTEMS}
        base = float(doc.get("base_acc", math.nan))
        t_final = summary.get("time_to_trl_final_ratio", "-")
        trl_final = median(_at(_runs(doc, "trl"), horizon, horizon)) if _runs(doc, "trl") else math.nan
        if math.isfinite(trl_final) and trl_final <= base:
            t_final = "n/a"  # TRL ended at or below the base: "reaching" it says nothing
        for system in SYSTEMS:
            rs = _runs(doc, system)
            if not rs:
                continue
            accs = [_at(rs, t, horizon, within=within) for t in times]
            ge = "-"
            if system == "rollflow" and _runs(doc, "trl"):
                pairs = [
                    (a, b)
                    for t, a, b in zip(times, medians["rollflow"], medians["trl"], strict=True)
                    if t > 30
                ]
                ge = "-" if not pairs else "yes" if all(a >= b for a, b in pairs) else "no"
            solved, unsolved = _at(rs, horizon, horizon, 1), _at(rs, horizon, horizon, 2)
            row = [name, splits.get(name, "?"), system, f"{base:.3f}"]
            row += [_fmt(a) for a in accs]
            row += [t_final if system == "rollflow" else "-",
                    summary.get(f"{system}_completions_to_0.8", "-"), _fmt(solved), _fmt(unsolved),
                    summary.get(f"{system}_completions_per_s", "-"),
                    summary.get("rollflow_core_busy_min", "-") if system == "rollflow" else "-", ge]  # fmt: skip
            lines.append(" | ".join(row))
            for t, a in zip(times, accs, strict=True):
                keys[f"suite_{name}_{system}_acc_at_{t:g}s"] = f"{median(a):.3f}"
            keys[f"suite_{name}_{system}_retention"] = f"{median(solved):.3f}"
            keys[f"suite_{name}_{system}_unsolved"] = f"{median(unsolved):.3f}"
            keys[f"suite_{name}_{system}_gain"] = f"{median(_at(rs, horizon, horizon)) - base:+.3f}"
            if system == "rollflow":
                keys[f"suite_{name}_rollflow_ge_trl_after_30s"] = ge
                keys[f"suite_{name}_time_to_trl_final_ratio"] = t_final
                keys[f"suite_{name}_rollflow_core_busy_min"] = summary.get("rollflow_core_busy_min", "-")
        keys.update(per_step(name, doc))
        keys[f"suite_{name}_base_acc"] = f"{base:.3f}"
    return "\n".join(lines), keys


def per_step(name: str, doc: dict[str, Any]) -> dict[str, str]:
    """Both systems at the same optimizer step: kept (solved) and learnt (unsolved) at ``S``, TRL's median
    step count at the horizon rounded down to a multiple of 10, each run read at its snapshot nearest
    ``S`` (none farther than ``S / 4``); plus each system's optimizer steps per second."""
    keys: dict[str, str] = {}
    trl = _runs(doc, "trl")
    mark = int(median([r["steps"] for r in trl]) // 10 * 10) if trl else 0
    for system in SYSTEMS:
        rs = _runs(doc, system)
        if not rs:
            continue
        sps = [r["steps"] / float(r["train_seconds"]) for r in rs]
        keys[f"suite_{name}_{system}_steps_per_s"] = f"{median(sps):.3f}"
        if mark <= 0:
            continue
        points = [retention_by_step(r) for r in rs]
        for i, what in ((1, "kept"), (2, "learnt")):
            xs = [value_near([(p[0], p[i]) for p in pts], mark, within=mark / 4) for pts in points]
            keys[f"suite_{name}_{system}_{what}_at_step_{mark}"] = _fmt(xs)
    return keys


def plot(docs: dict[str, dict[str, Any]], splits: dict[str, str], path: Path, horizon: float) -> None:
    """One panel per family: median held-out accuracy over seeds against training seconds, band min..max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(docs))
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), dpi=110, squeeze=False)
    grid = [horizon * i / 40 for i in range(41)]
    for ax, (name, doc) in zip(axes.flat, docs.items(), strict=False):
        for system in SYSTEMS:
            rs = _runs(doc, system)
            if not rs:
                continue
            at = [_at(rs, t, horizon) for t in grid]
            mid = [median(a) for a in at]
            lo = [min((x for x in a if math.isfinite(x)), default=math.nan) for a in at]
            hi = [max((x for x in a if math.isfinite(x)), default=math.nan) for a in at]
            ax.plot(grid, mid, color=COLORS[system], lw=1.6, label=f"{system} ({len(rs)} seeds)")
            ax.fill_between(grid, lo, hi, color=COLORS[system], alpha=0.18, lw=0)
        ax.set_title(f"{name} ({splits.get(name, '?')})", fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.set_xlabel("training seconds", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(docs) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("greedy held-out accuracy")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
