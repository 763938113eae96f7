"""Which difference from TRL makes rollflow forget: one change at a time, side by side with TRL, on a dev family.

What it is: for each arm it runs ``python -m bench.suite.run`` on one family (default ``add_gap``, a dev
family: never a test family) into ``<out>/<arm>/``, every learning key at the candidate default plus the
arm's one change, then prints, per arm, the median (min..max over seeds) of

* ``acc`` (held-out), ``solved`` (retention: accuracy on the problems the start solved, 1.0 at the start by
  construction) and ``unsolved`` (what was learnt) at the horizon, read at the run's last snapshot;
* the same ``solved`` / ``unsolved`` at optimizer steps (``--steps``), each run read at its snapshot
  nearest the step, none farther than half the smallest spacing between the marks (0 counting as one) (a run with none that near is left
  out of that median, and the count says so);
* ``steps`` (optimizer steps in the horizon), ``steps_s`` and ``compl_s`` (per training second), and for
  rollflow its own accounting (``TIMING``): the least busy core, the trainer's share waiting for data, the
  rollout's share held by the claim gate and by the staleness bound, the server's busy share and mean batch.

The arms (``ARMS``): ``trl`` (its ``GRPOTrainer``: on-policy, ``loss_type dapo``, ``scale_rewards
group``), ``rollflow`` (the candidate defaults: staleness up to 2, the decoupled loss with its
behaviour cap), ``on_policy`` (``rollout.max_staleness=0``), ``no_decoupled`` (the plain PPO ratio
against the behaviour policy: no proximal pass, no behaviour cap), ``uncapped``
(``train.behav_imp_weight_cap=null``), ``kl_anchor`` (a k3 KL penalty to the start, ``train.kl_ctl=0.04``,
the beta of GRPO's paper), ``review`` (the prompt review: solved prompts back in up to a quarter of the
slots, first after 4 versions, ``rollout.review_share=0.25``); for throughput, ``server_threads_2`` (the server on 2 threads beside a
1-thread trainer on 2 cores) and ``threads_2_2`` (both on 2). TRL's loss aggregation and advantage scaling are rollflow's
defaults already (token-mean over the batch; group mean and std), so they are not an arm.

Run (about 3 minutes per run on 2 idle cores, start-up and scoring included; 5 seeds x 4 arms about an
hour)::

    python -m bench.retention_ablation --arms trl rollflow on_policy no_decoupled
    python -m bench.retention_ablation --report-only     # re-read what is under --out

It prints ``key value`` lines (``<arm>_solved_at_<S>s``, ``<arm>_solved_at_step_<N>``, ...), writes
them to ``<out>/summary.txt`` and draws ``<out>/per_step.png`` (kept and learnt against optimizer steps,
the median per arm).

What it is not: a tuner. The rule for defaults (docs/learning.md) asks for the test families' verdict
before a default changes.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.peer_eval import mark_window, median, retention_by_step, spread, value_near

ROOT = Path(__file__).resolve().parent.parent
ARMS: dict[str, tuple[str, list[str]]] = {  # name: (system, its one change)
    "trl": ("trl", []),
    "rollflow": ("rollflow", []),
    "on_policy": ("rollflow", ["rollout.max_staleness=0"]),
    "no_decoupled": ("rollflow", ["train.use_decoupled_loss=false"]),
    "uncapped": ("rollflow", ["train.behav_imp_weight_cap=null"]),
    "kl_anchor": ("rollflow", ["train.kl_ctl=0.04"]),  # an anchor to the start: GRPO's published beta
    # solved prompts brought back before they regress, a quarter of the slots at most (RECALL-style)
    "review": ("rollflow", ["rollout.review_share=0.25", "rollout.review_interval=4"]),
    # throughput: the generation server above the cores the trainer leaves (passive OpenMP waits)
    "server_threads_2": ("rollflow", ["inference.server_threads=2"]),
    "threads_2_2": ("rollflow", ["inference.server_threads=2", "train.threads=2"]),
}
TIMING = {  # rollflow's own accounting (MLflow time/...), each a share of the run
    "core_min": "time/cpu/busy_frac_min",
    "trainer_waits": "time/trainer/waiting_data_frac",
    "gate_holds": "time/rollout/claim_wait_frac",
    "bound_holds": "time/rollout/capacity_wait_frac",
    "server_busy": "time/server0/busy_frac",
    "server_batch": "time/server0/avg_batch",
}


def _runs(out: Path, arm: str, family: str) -> list[dict[str, Any]]:
    """The arm's runs, from what ``bench.peer`` wrote (none when the arm has not run)."""
    system = ARMS[arm][
        0
    ]  # bench.peer names its file after the family's config (add_gap: peer_tiny_hard.json)
    paths = sorted((out / arm / family).glob("peer_*.json"))
    return [r for path in paths for r in json.loads(path.read_text())["runs"] if r["system"] == system]


def report(out: Path, family: str, steps: list[int]) -> dict[str, str]:
    """The ``key value`` figures of every arm that has runs under ``out``."""
    keys: dict[str, str] = {}
    within = mark_window(steps)  # half the smallest spacing between the step marks, 0 counting as one
    for arm in ARMS:
        runs = _runs(out, arm, family)
        if not runs:
            continue
        horizon = int(round(float(runs[0]["train_seconds"])))
        last = [r["retention"][-1] for r in runs]
        acc = [r["curve"][-1][1] for r in runs]
        cols = {"acc": acc, "solved": [x[1] for x in last], "unsolved": [x[2] for x in last]}
        for name, xs in cols.items():
            keys[f"{arm}_{name}_at_{horizon}s"] = f"{median(xs):.3f} ({spread(xs)}) n={len(xs)}"
        keys[f"{arm}_steps"] = (
            f"{median([r['steps'] for r in runs]):.0f} ({spread([r['steps'] for r in runs])})"
        )
        cps = [r["completions_per_s"] for r in runs]
        keys[f"{arm}_compl_s"] = f"{median(cps):.0f} ({spread(cps)})"
        sps = [r["steps"] / float(r["train_seconds"]) for r in runs]
        keys[f"{arm}_steps_s"] = f"{median(sps):.2f} ({spread(sps)})"
        for name, key in TIMING.items():
            xs = [float(r["timing"][key]) for r in runs if key in r.get("timing", {})]
            if xs:
                keys[f"{arm}_{name}"] = f"{median(xs):.2f} ({spread(xs)})"
        per_step = [retention_by_step(r) for r in runs]
        for step in steps:
            for i, name in ((1, "solved"), (2, "unsolved")):
                near = (
                    value_near([(p[0], p[i]) for p in points], step, within=within) for points in per_step
                )
                xs = [x for x in near if not math.isnan(x)]
                if xs:
                    keys[f"{arm}_{name}_at_step_{step}"] = f"{median(xs):.3f} ({spread(xs)}) n={len(xs)}"
    return keys


def plot(out: Path, family: str, path: Path) -> None:
    """Kept and learnt against optimizer steps, one line per arm: at each snapshot (every run of an arm
    takes them at the same training seconds), the median step and the median accuracy over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for arm in ARMS:
        runs = [retention_by_step(r) for r in _runs(out, arm, family)]
        if not runs:
            continue
        n = min(len(r) for r in runs)
        steps = [median([r[i][0] for r in runs]) for i in range(n)]
        for ax, col in zip(axes, (1, 2), strict=True):
            ax.plot(steps, [median([r[i][col] for r in runs]) for i in range(n)], marker="o", ms=3, label=arm)
    for ax, title in zip(
        axes, ("kept (start-solved problems)", "learnt (start-unsolved problems)"), strict=True
    ):
        ax.set_title(f"{family}: {title}")
        ax.set_xlabel("optimizer steps")
        ax.set_ylabel("held-out accuracy (median over seeds)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.retention_ablation", description=__doc__.split("\n")[0])
    p.add_argument("--family", default="add_gap", help="a dev family (default add_gap)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--snapshot-every", type=float, default=15.0)
    p.add_argument(
        "--steps", type=int, nargs="+", default=[100, 200, 300, 400], help="optimizer steps to read at"
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "retention_ablation"))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    from bench.suite.families import FAMILIES

    if args.family not in FAMILIES or FAMILIES[args.family].split != "dev":
        dev = sorted(n for n, f in FAMILIES.items() if f.split == "dev")
        p.error(f"--family must be a dev family (one of {', '.join(dev)}): test families judge, never tune")
    out = Path(args.out).resolve()
    for arm in [] if args.report_only else args.arms:
        system, change = ARMS[arm]
        cmd = [
            sys.executable, "-m", "bench.suite.run", "--families", args.family, "--seeds", *map(str, args.seeds),
            "--seconds", str(args.seconds), "--snapshot-every", str(args.snapshot_every),
            "--eval-times", str(args.seconds), "--systems", system, "--out", str(out / arm), *change,
        ]  # fmt: skip
        print(f"# {arm}: {' '.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    keys = report(out, args.family, args.steps)
    if not keys:
        print(f"bench.retention_ablation: no runs under {out}", file=sys.stderr)
        return 1
    lines = [f"{k} {v}" for k, v in keys.items()]
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    plot(out, args.family, out / "per_step.png")
    print(f"# wrote {out / 'summary.txt'} and per_step.png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
