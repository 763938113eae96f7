"""Compare two settings of rollflow (an A/B of one technique) from ``bench.peer`` result folders.

What it is: the reader behind the one-row-per-technique tables of docs/benchmarks.md. Each arm is a
label and one or more ``bench.peer --systems rollflow --out DIR`` folders (a seed per folder, or many);
it reads every ``peer_*.json`` under them and prints, per arm, medians over its runs with ``_spread``
(min..max) beside them:

* ``{arm}_acc_at_step_{N}`` for every optimizer step N that every run of both arms has a snapshot at
  (``--snapshot-steps``): at a fixed step both arms have generated the same completions (128 a step at
  16 x 8), so this is learning per generated token, blind to the machine's speed;
* ``{arm}_completions_per_s``, ``{arm}_steps``, ``{arm}_acc_final`` (the last snapshot);
* ``{arm}_completions_to_0.8`` and ``{arm}_runs_reaching_0.8`` (``bench.peer.completions_to``);
* ``acc_gain_at_step_{N}``: B's median minus A's.

Run it (after ``bench.peer`` wrote the folders)::

    python -m bench.peer_compare --a off bench/results/curriculum_ablation/off-s* \\
        --b on bench/results/curriculum_ablation/on-s*

What it is not: a runner (``bench.peer`` runs and scores) or a significance test; with 5 seeds read the
spreads.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from bench.peer import completions_to
from bench.peer_eval import median, spread


def load_runs(folders: list[str]) -> list[dict[str, Any]]:
    """Every rollflow run of every ``peer_*.json`` under ``folders``."""
    runs: list[dict[str, Any]] = []
    for folder in folders:
        for path in sorted(Path(folder).glob("peer_*.json")):
            doc = json.loads(path.read_text())
            runs += [r for r in doc["runs"] if r.get("system") == "rollflow"]
    return runs


def arm_keys(label: str, runs: list[dict[str, Any]], steps: list[int]) -> dict[str, str]:
    out: dict[str, str] = {f"{label}_runs": str(len(runs))}
    for n in steps:
        accs = [float(r["step_acc"][str(n)]) for r in runs]
        out[f"{label}_acc_at_step_{n}"] = f"{median(accs):.3f}"
        out[f"{label}_acc_at_step_{n}_spread"] = spread(accs)
    for key in ("completions_per_s", "steps"):
        vals = [float(r[key]) for r in runs]
        out[f"{label}_{key}"] = f"{median(vals):.1f}"
        out[f"{label}_{key}_spread"] = spread(vals)
    finals = [a for a in (_final(r) for r in runs) if math.isfinite(a)]
    out[f"{label}_acc_final"] = f"{median(finals):.3f}" if finals else "none"
    out[f"{label}_acc_final_spread"] = spread(finals)
    got = [c for c in (completions_to(r, 0.8) for r in runs) if math.isfinite(c)]
    out[f"{label}_completions_to_0.8"] = f"{median(got):.0f}" if got else "none"
    out[f"{label}_completions_to_0.8_spread"] = spread(got)
    out[f"{label}_runs_reaching_0.8"] = f"{len(got)}/{len(runs)}"
    return out


def _final(run: dict[str, Any]) -> float:
    curve = [a for _, a in sorted(run.get("curve", [])) if a is not None]
    return curve[-1] if curve else math.nan


def common_steps(runs: list[dict[str, Any]]) -> list[int]:
    """Optimizer steps every run has a scored snapshot at."""
    sets = [{int(k) for k, a in r.get("step_acc", {}).items() if a is not None} for r in runs]
    return sorted(set.intersection(*sets)) if sets else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", nargs="+", required=True, metavar=("LABEL", "DIR"), help="label, then folders")
    p.add_argument("--b", nargs="+", required=True, metavar=("LABEL", "DIR"), help="label, then folders")
    args = p.parse_args(argv)
    (la, *da), (lb, *db) = args.a, args.b
    a, b = load_runs(da), load_runs(db)
    if not a or not b:
        print(f"bench.peer_compare: no rollflow runs under {da if not a else db}", flush=True)
        return 2
    steps = common_steps(a + b)
    keys = {**arm_keys(la, a, steps), **arm_keys(lb, b, steps)}
    for n in steps:
        gain = float(keys[f"{lb}_acc_at_step_{n}"]) - float(keys[f"{la}_acc_at_step_{n}"])
        keys[f"acc_gain_at_step_{n}"] = f"{gain:+.3f}"
    for k, v in keys.items():
        print(f"{k} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
