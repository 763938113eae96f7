"""``make bench-suite``: run the suite's families side by side with TRL, then print the table and draw the picture.

What it is: for each selected family (``bench.suite.families``; default: the **test** families) it
writes the family's config, runs ``python -m bench.peer`` on it (per seed TRL, then rollflow, one after
the other on this machine; no synchronous baseline) with every learning key at the candidate default
(``candidate_overrides``), into ``<out>/<family>/``, then prints ``bench.suite.report``'s table and
``key value`` lines and writes ``<out>/summary.txt``, ``<out>/suite.json`` and ``<out>/suite.png``.

Options: ``--families`` (names, ``dev``, ``test`` or ``all``), ``--seeds`` (default 1-5), ``--seconds`` (the
horizon, default 120), ``--eval-times`` (the table's columns), ``--snapshot-every`` (seconds between
weight snapshots, each scored off the clock), ``--size`` / ``--eval-size`` (a reasoning-gym family's
prompts), ``--calibrate`` (only build each family's warm start and print its base accuracy, solved share and
reachable share, and merge them with the family's settings into ``<out>/calibration.json``: run it
first; a base outside 0.1-0.4, or a reachable share below ``LEARNABLE_REACHABLE``, means the family's
setting must change), ``--report-only``
(only rebuild the table and picture from results already there), and dotted overrides for both systems.

How long: per family ``seeds x 2 systems x (horizon + ~20 s start-up and scoring)``, plus one warm start
(3-7 min) unless the family's model is already built. The test run (3 families x 5 seeds x 2 x 120 s) is
about 70 minutes on 2 idle cores (23 minutes a family, measured); ``--families dev`` (4 families) about
1.5 hours.

Smoke run (about 4 minutes on a loaded 2-core machine; proves the path end to end, measures nothing; use a
dev family, so no test family is looked at)::

    python -m bench.suite.run --families count_bits --seeds 1 --seconds 20 --snapshot-every 10 --eval-times 10 20 \\
        --size 200 --eval-size 40 --out runs/suite-smoke model.tiny.warm_start_steps=50

What it is not: a tuner; the rule for defaults (docs/learning.md) reads its table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.suite.families import (
    FAMILIES,
    LEARNABLE_REACHABLE,
    ROOT,
    Family,
    candidate_overrides,
    family_config,
    select,
)
from bench.suite.report import load, plot, table


def calibrate(f: Family, config: Path, overrides: list[str]) -> dict[str, float]:
    """Build ``f``'s starting model and score it greedy on the held-out set: base accuracy (= solved share)."""
    from bench.peer import start_model
    from bench.peer_eval import SnapshotScorer
    from rollflow.api.workflow import import_string
    from rollflow.configuration.loader import load_config
    from rollflow.data import load_prompts
    from rollflow.models.bootstrap import bootstrap_for

    cfg = load_config(config, overrides)
    if cfg.model.bootstrap_tiny:
        path = bootstrap_for(cfg)
    else:
        path = start_model(config, cfg.model.path)
    rows = load_prompts(cfg.dataset, cfg.eval.split or cfg.dataset.eval_split)[: cfg.eval.n_prompts or None]
    gen = cfg.rollout.generation
    scorer = SnapshotScorer(
        path, rows, import_string(cfg.dataset.reward_fn), max_new_tokens=gen.max_new_tokens
    )
    correct = scorer.correct(None)
    acc = sum(correct) / max(1, len(correct))
    k = cfg.rollout.group_size
    counts = scorer.solve_counts(k, gen.temperature, seed=cfg.seed)
    return {
        "base_acc": acc,
        "base_solved": float(sum(correct)),
        "n_eval": float(len(correct)),
        **reachability(correct, counts, k),
    }


def reachability(correct: list[bool], counts: list[int], k: int) -> dict[str, float]:
    """What a group of ``k`` samples can learn from at the start, on the held-out rows.

    ``reachable_unsolved`` = #{i: not correct_i and counts_i > 0} / #{i: not correct_i}: the share of the
    problems greedy decoding gets wrong that at least one of ``k`` samples solves (GRPO's only signal on
    them). ``mixed`` = #{i: 0 < counts_i < k} / n: the share of rows whose group has a non-zero advantage.
    """
    n = max(1, len(counts))
    wrong = [c for c, ok in zip(counts, correct, strict=True) if not ok]
    return {
        "reachable_unsolved": sum(c > 0 for c in wrong) / max(1, len(wrong)),
        "mixed": sum(0 < c < k for c in counts) / n,
        "sample_acc": sum(counts) / (n * k),
        "group_size": float(k),
    }


def record_calibration(path: Path, f: Family, base: dict[str, float], overrides: list[str]) -> dict[str, Any]:
    """Merge family ``f``'s base figures and settings into ``path`` (one entry per family, the latest kept).

    The solved share is the base accuracy; the unsolved share is ``1 - base_acc``; ``in_range`` says
    whether the base lies in 0.1-0.4 with both shares non-empty.
    """
    docs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    n, solved = int(base["n_eval"]), int(base["base_solved"])
    acc = base["base_acc"]
    steps = [o.split("=", 1)[1] for o in overrides if o.startswith("model.tiny.warm_start_steps=")]
    docs[f.name] = {
        "split": f.split,
        "task": f.task,
        "params": f.params,
        "warm_start_params": f.warm_start_params,
        "warm_start_steps": int(steps[-1]) if steps else f.warm_start_steps,
        "n_eval": n,
        "base_solved": solved,
        "base_unsolved": n - solved,
        "base_acc": round(acc, 4),
        "share_solved": round(acc, 4),
        "share_unsolved": round(1.0 - acc, 4),
        "in_range": bool(0.1 <= acc <= 0.4 and 0 < solved < n),
        **{key: round(base[key], 4) for key in ("reachable_unsolved", "mixed", "sample_acc") if key in base},
        "learnable": bool(base.get("reachable_unsolved", 0.0) >= LEARNABLE_REACHABLE),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(docs, indent=1, sort_keys=True) + "\n")
    return docs[f.name]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite.run", description=__doc__.split("\n")[0])
    p.add_argument("--families", nargs="+", default=["test"], help="names, dev, test or all (default: test)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--seconds", type=float, default=120.0, help="the horizon: training seconds per run")
    p.add_argument("--eval-times", type=float, nargs="+", default=[30, 60, 90, 120])
    p.add_argument("--snapshot-every", type=float, default=15.0)
    p.add_argument("--size", type=int, default=2000, help="a reasoning-gym family's training prompts")
    p.add_argument("--eval-size", type=int, default=200, help="a reasoning-gym family's held-out prompts")
    p.add_argument("--systems", nargs="+", default=["trl", "rollflow"], choices=["trl", "rollflow"])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "suite_recalibrated"))
    p.add_argument("--calibrate", action="store_true", help="only build the warm starts and print the base")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table and the picture")
    p.add_argument("overrides", nargs="*", help="dotted config overrides for both systems")
    args = p.parse_args(argv)

    families = select(args.families)
    out = Path(args.out).resolve()
    configs = out / "configs"
    splits = {f.name: f.split for f in FAMILIES.values()}
    times = [t for t in args.eval_times if t <= args.seconds]
    overrides = [*candidate_overrides(), *args.overrides]
    for f in families:
        config = family_config(f, configs, size=args.size, eval_size=args.eval_size)
        if args.calibrate:
            base = calibrate(f, config, overrides)
            rec = record_calibration(out / "calibration.json", f, base, overrides)  # its verdicts, printed
            in_range = "ok" if rec["in_range"] else "OUT OF 0.1-0.4"
            reach = "ok" if rec["learnable"] else "BELOW"
            print(f"suite_{f.name}_base_acc {base['base_acc']:.3f}  # {f.split}, {in_range}", flush=True)
            print(f"suite_{f.name}_base_solved {base['base_solved']:.0f}/{base['n_eval']:.0f}", flush=True)
            print(f"suite_{f.name}_reachable_unsolved {base['reachable_unsolved']:.3f}  # {reach} "
                  f"{LEARNABLE_REACHABLE}", flush=True)  # fmt: skip
            for key in ("mixed", "sample_acc"):
                print(f"suite_{f.name}_{key} {base[key]:.3f}", flush=True)
            continue
        if args.report_only:
            continue
        cmd = [
            sys.executable, "-m", "bench.peer", "--config", str(config), "--seeds", *map(str, args.seeds),
            "--seconds", str(args.seconds), "--sync-seconds", "0", "--snapshot-every", str(args.snapshot_every),
            "--systems", *args.systems, "--out", str(out / f.name), *overrides,
        ]  # fmt: skip
        print(f"# {f.name} ({f.split}): {' '.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    if args.calibrate:
        return 0
    docs = load(out, [f.name for f in families])
    if not docs:
        print(f"bench.suite: no results under {out}", file=sys.stderr)
        return 1
    text, keys = table(docs, splits, times, args.seconds)
    print(text)
    for k, v in keys.items():
        print(f"{k} {v}")
    (out / "summary.txt").write_text(text + "\n\n" + "\n".join(f"{k} {v}" for k, v in keys.items()) + "\n")
    meta = {"families": [dataclasses.asdict(f) for f in families], "seeds": args.seeds, "horizon_s": args.seconds,
            "eval_times": times, "overrides": overrides, "keys": keys}  # fmt: skip
    (out / "suite.json").write_text(json.dumps(meta, indent=1))
    plot(docs, splits, out / "suite.png", args.seconds)
    print(f"# wrote {out / 'summary.txt'}, suite.json and suite.png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
