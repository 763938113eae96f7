"""Plot of the curriculum probability sweep (this folder): held-out accuracy per optimizer step and per
training second, 4 arms x 5 seeds. Run from the repository root: python bench/results/curriculum_sweep/plot.py"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
ARMS = {"A": "0.9 / 0.5 (before)", "B": "0.97 / 0.8", "C": "0.75 / 0.25", "D": "0.97 / 0.5 (default now)"}
STEPS = [0, 150, 300, 450, 600]

fig, (ax_step, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
for (arm, label), color in zip(
    ARMS.items(), ["tab:gray", "tab:blue", "tab:orange", "tab:green"], strict=True
):
    runs = [json.loads(p.read_text())["runs"][0] for p in sorted(HERE.glob(f"{arm}-s*/peer_*.json"))]
    per_step = [[r["step_acc"][str(s)] for r in runs] for s in STEPS]
    ax_step.plot(STEPS, [statistics.median(v) for v in per_step], color=color, label=label, marker="o")
    ax_step.fill_between(
        STEPS, [min(v) for v in per_step], [max(v) for v in per_step], color=color, alpha=0.15
    )
    for i, r in enumerate(runs):
        t, acc = zip(*r["curve"], strict=True)
        ax_time.plot(t, acc, color=color, alpha=0.6, label=label if i == 0 else None)
ax_step.set(xlabel="optimizer step (128 completions each)", ylabel="held-out accuracy (greedy, 200)")
ax_step.set_title("median and min..max over 5 seeds")
ax_time.set(xlabel="training seconds (2 cores)", ylabel="held-out accuracy")
ax_time.set_title("every run")
for ax in (ax_step, ax_time):
    ax.axhline(0.8, color="black", lw=0.5, ls=":")
    ax.legend(title="skip_solved / skip_unsolved", fontsize=8)
fig.suptitle("Prompt curriculum probabilities on add_gap (configs/tiny_hard.yaml), 600 steps per run")
fig.tight_layout()
fig.savefig(HERE / "sweep.png", dpi=110)
