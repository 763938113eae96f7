"""Side-by-side: TRL's GRPOTrainer and rollflow on the same model, prompts, reward, eval and geometry.

What it is: the harness behind the README's learning figures. For one config - any user config: a
model directory (``model.path``), a ``files`` (or synthetic) dataset and a ``module:function`` reward -
it

1. gets the starting model once: the built-in tiny model via ``rollflow.models.bootstrap`` when
   ``model.bootstrap_tiny`` is set; otherwise ``model.path`` as is. A ``model.path`` that does not exist
   is built only when the config's folder holds a ``make_task.py`` (an outside-built task such as
   ``bench/tasks/sub_gap/``): ``python -m <that module> --out <model.path's parent>``; else it stops
   and says what to build;
2. fixes the prompts (the train split, in rollflow's per-seed order) and the held-out prompts (the
   first ``eval.n_prompts`` of the eval split);
3. for each seed, one system after the other on this machine with the same thread budget: TRL
   (``bench/peer_trl.py`` in its own venv, ``make trl-venv``; TRL is never a rollflow dependency) and
   rollflow (``bench/peer_rollflow.py``: the real loops, asynchronous); then, per seed, rollflow's
   synchronous baseline for ``--sync-seconds``;
4. scores every weight snapshot of every run with one scorer (``bench.peer_eval``: greedy, held-out,
   the config's reward), off the training clock - the clock each system reports counts training seconds;
5. prints ``key value`` lines, writes ``peer_<name>.json`` (every curve and step timing) and
   ``peer_<name>.png`` (accuracy against training seconds and against optimizer steps, every seed).

Both systems get: the same prompts in the same order (rollflow's per-seed permutation), rendered by the
model's own chat template; the same reward function (by its import string; TRL's venv imports it too);
16 prompts x 8 samples per step, T = 1, ``max_new_tokens`` and lr of the config, AdamW, grad clip 1.0,
no KL. Snapshots are kept every ``--snapshot-every`` training seconds and at the optimizer steps of
``--snapshot-steps``.

Printed keys, medians over seeds with ``_spread`` (min..max) beside them: ``trl_completions_per_s``,
``rollflow_completions_per_s``, ``completions_per_s_ratio``, ``trl_acc_at_{S}s``, ``rollflow_acc_at_{S}s``
(S = ``--seconds``, 600 by default), ``{trl,rollflow}_acc_base_solved_at_{S}s`` and ``..._unsolved_at_{S}s``
(accuracy on the held-out problems the starting model solved / did not: retention and learning;
``base_solved`` is how many it solved), ``time_to_trl_final_ratio`` (median seconds rollflow needs to reach
TRL's median final accuracy, / S), ``rollflow_time_to_0.8`` (median, or ``none``),
``{trl,rollflow}_completions_to_0.8`` (learning per generated token, ``completions_to``; with
``train.ppo_epochs`` > 1 the per-step keys compare unlike steps: TRL counts each of its ``num_iterations``
updates on a batch as a step, rollflow the batch, so compare per token),
``{trl,rollflow}_acc_at_step_{N}`` and ``per_step_acc_ratio_at_{N}`` for N in ``--snapshot-steps``
(500, 1000, 1500 by default; rollflow's median accuracy at optimizer step N / TRL's, ``none`` when a
run of either system did not reach step N; the spread is of the per-seed ratios),
``async_vs_sync_step_ratio`` (sync s/step / async s/step) and
``sync_step_vs_gen_plus_train`` (the synchronous step against its generation + training); for rollflow
and its synchronous baseline, where the time went (``rollflow.timing``): ``{system}_core_busy_min`` (the
least busy core's share of the race), ``{system}_trainer_waiting_data_frac``,
``{system}_rollout_capacity_wait_frac``, ``{system}_rollout_paused_frac``, the rollout's other named waits
``{system}_rollout_flush_wait_frac`` / ``_claim_wait_frac`` / ``_idle_frac``, ``{system}_server_busy_frac``,
and a ``# {system} time:`` line saying which role waits for which (the median-steps seed's).

Run it (from the repository root: the configs' relative paths are relative to it)::

    make bench-peer                                   # configs/tiny_hard.yaml, 5 seeds x 600 s each
    python -m bench.peer --config bench/tasks/sub_gap/config.yaml        # the outside-built task
    python -m bench.peer --config configs/tiny_hard2.yaml --seeds 1 2 3 --seconds 600

What it is not: a test (the suite runs a few-second variant and checks only that both systems ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peer_eval import SnapshotScorer, base_split_accuracies, median, spread, time_to, value_at

ROOT = Path(__file__).resolve().parent.parent
TRL_PY = ROOT / ".venv-trl" / "bin" / "python"


def _run(cmd: list[str], log: Path, threads: int) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        # idle OpenMP threads sleep instead of spinning: on 2 shared cores spinning made TRL's 2-thread
        # steps 4-7x slower; both systems get the same setting
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}); log {log}:\n{tail}")


def _prompt_order(rows: list[dict[str, Any]], seed: int, n: int) -> list[dict[str, Any]]:
    """The first ``n`` prompts rollflow's rollout hands out for ``seed`` (one worker: global positions
    0, 1, 2, ... through the epoch permutations of ``rollflow.rollout.prompt_source``), each with the
    row's other fields as ``data`` (what rollflow hands the reward as ``**data``)."""
    from rollflow.rollout.prompt_source import epoch_order

    out, orders = [], {}
    for p in range(n):
        epoch, pos = divmod(p, len(rows))
        order = orders.setdefault(epoch, epoch_order(len(rows), seed, epoch))
        row = rows[order[pos]]
        data = {k: v for k, v in row.items() if k not in ("prompt_id", "messages", "answer")}
        out.append({"messages": row["messages"], "answer": str(row["answer"]), "data": data})
    return out


class TaskNotBuiltError(RuntimeError):
    """``model.path`` does not exist and nothing beside the config says how to build it."""


def start_model(config: str | Path, model_path: str | Path) -> Path:
    """The starting model directory of a config without ``model.bootstrap_tiny`` (see the module docstring).

    A missing directory is built by the ``make_task.py`` beside the config, as
    ``python -m <module> --out <model_path's parent>`` (the task's convention: ``--out`` receives
    ``model/`` and the dataset files); a hub name or a directory elsewhere must exist already.

    Raises:
        TaskNotBuiltError: the directory is missing and there is no ``make_task.py`` to build it.
        RuntimeError: the build ran but left no model at ``model_path``.
    """
    path = Path(model_path).resolve()
    if (path / "config.json").is_file():
        return path
    maker = Path(config).resolve().parent / "make_task.py"
    if not maker.is_file():
        raise TaskNotBuiltError(
            f"model.path {model_path} is not a model directory (no config.json) and {maker.parent} has no "
            "make_task.py to build it; build the model there first, or set model.path"
        )
    try:
        module = ".".join(maker.relative_to(ROOT).with_suffix("").parts)
    except ValueError as e:
        raise TaskNotBuiltError(f"{maker} is outside {ROOT}; run it yourself with --out {path.parent}") from e
    cmd = [sys.executable, "-m", module, "--out", str(path.parent)]
    print(f"# {model_path} is missing: building it with {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=sys.stderr)
    if not (path / "config.json").is_file():
        raise RuntimeError(f"{' '.join(cmd[1:])} finished but {path} holds no config.json")
    return path


def _curve(run_dir: Path, scorer: SnapshotScorer, base_correct: list[bool]) -> dict[str, Any]:
    """The run's ``curve.json`` plus ``curve`` ([(training s, accuracy)]), ``step_acc`` ({step: acc}) and
    ``retention`` ([(training s, accuracy on base-solved, on base-unsolved)])."""
    doc = json.loads((run_dir / "curve.json").read_text())
    base_acc = sum(base_correct) / max(1, len(base_correct))
    points = [(0.0, base_acc)]
    step_acc = {"0": base_acc}
    retention = [(0.0, *base_split_accuracies(base_correct, base_correct))]
    for snap in doc["snapshots"]:
        if snap.get("file") is None or snap["t"] <= 0:
            continue
        correct = scorer.correct(run_dir / snap["file"])
        acc = sum(correct) / max(1, len(correct))
        points.append((float(snap["t"]), acc))
        retention.append((float(snap["t"]), *base_split_accuracies(correct, base_correct)))
        step_acc[str(int(snap["step"]))] = acc
        (run_dir / snap["file"]).unlink()  # scored; the curve is what we keep
    doc["curve"] = sorted(points)
    doc["step_acc"] = step_acc  # JSON keys are strings
    doc["retention"] = sorted(retention)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny_hard.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--seconds", type=float, default=600.0, help="training seconds per run")
    p.add_argument(
        "--max-steps",
        type=int,
        default=10**7,
        help="also stop each run after this many optimizer steps: compares learning per step and per "
        "generated token on a machine whose speed varies",
    )
    p.add_argument("--sync-seconds", type=float, default=60.0, help="per seed; 0 = skip the sync baseline")
    p.add_argument("--snapshot-every", type=float, default=30.0, help="training seconds between snapshots")
    p.add_argument(
        "--snapshot-steps",
        type=int,
        nargs="*",
        default=list(PER_STEP),
        help="optimizer steps that also get a snapshot: the per-step comparison's N",
    )
    p.add_argument("--threads", type=int, default=2, help="the thread budget of each system")
    p.add_argument("--trl-lr", type=float, default=None, help="default: the config's train.lr")
    p.add_argument("--systems", nargs="+", default=["trl", "rollflow"], choices=["trl", "rollflow"])
    p.add_argument(
        "--rollout-process",
        action="store_true",
        help="run rollflow's rollout loop in a process of its own (default: a thread beside the trainer, "
        "as the embedded flow runs it)",
    )
    p.add_argument("--n-eval", type=int, default=None, help="held-out prompts (default: eval.n_prompts)")
    p.add_argument("--out", default=None, help="results dir (default bench/results/peer_<name>)")
    p.add_argument(
        "overrides", nargs="*", help="dotted config overrides for both systems, e.g. train.lr=5e-5"
    )
    args = p.parse_args(argv)

    from rollflow.api.workflow import import_string
    from rollflow.configuration.loader import load_config
    from rollflow.data import load_prompts
    from rollflow.models.bootstrap import bootstrap_for, current_tiny_model

    # a task folder's config.yaml is named after its folder (bench/tasks/sub_gap/config.yaml -> sub_gap)
    name = Path(args.config).stem if Path(args.config).stem != "config" else Path(args.config).parent.name
    out = Path(args.out or ROOT / "bench" / "results" / f"peer_{name}").resolve()
    runs_dir = ROOT / "runs" / "peer" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.config, args.overrides)
    if "trl" in args.systems and not TRL_PY.exists():
        print("TRL's venv is missing: run `make trl-venv` (or `make bench-peer`) first", file=sys.stderr)
        return 2
    model_path = runs_dir / "model"
    if cfg.model.bootstrap_tiny:
        ready = current_tiny_model(cfg)
        if ready is not None:  # the config's own directory already holds this exact build: no warm start
            model_path = ready
            print(f"# reusing the tiny model at {ready} (same build key)", flush=True)
        else:
            bootstrap_for(
                dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model_path)))
            )
    else:
        try:
            model_path = start_model(args.config, cfg.model.path)
        except TaskNotBuiltError as e:
            print(f"bench.peer: {e}", file=sys.stderr)
            return 2
    common = [*args.overrides, f"model.path={model_path}", "model.bootstrap_tiny=false"]
    train_rows = load_prompts(cfg.dataset, cfg.dataset.train_split)
    eval_rows = load_prompts(cfg.dataset, cfg.eval.split or cfg.dataset.eval_split)
    n_eval = args.n_eval or cfg.eval.n_prompts or len(eval_rows)
    eval_rows = eval_rows[:n_eval]
    gen = cfg.rollout.generation
    scorer = SnapshotScorer(
        model_path,
        eval_rows,
        import_string(cfg.dataset.reward_fn),
        max_new_tokens=cfg.eval.max_new_tokens or gen.max_new_tokens,
    )
    base_correct = scorer.correct(None)  # decides the base-solved / base-unsolved split
    base_acc = sum(base_correct) / max(1, len(base_correct))
    print(f"base_acc {base_acc:.3f}", flush=True)
    print(f"base_solved {sum(base_correct)}", flush=True)

    runs: list[dict[str, Any]] = []
    jobs = [(s, sysname) for s in args.seeds for sysname in args.systems]
    if "rollflow" in args.systems and args.sync_seconds > 0:
        jobs += [(s, "rollflow-sync") for s in args.seeds]
    for seed, system in jobs:
        run_dir = runs_dir / f"{system}-s{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = run_dir / "spec.json"
        t0 = time.monotonic()
        if system == "trl":
            n_prompts = int(args.seconds * 120) + 1000  # more than TRL can use at ~40 prompts/s
            spec = {
                "model_path": str(model_path),
                "prompts": _prompt_order(train_rows, seed, n_prompts),
                "seed": seed,
                "seconds": args.seconds,
                "max_steps": args.max_steps,
                "snapshot_every_s": args.snapshot_every,
                "lr": args.trl_lr if args.trl_lr is not None else cfg.train.lr,
                "batch_prompts": cfg.train.batch_size,
                "group_size": cfg.rollout.group_size,
                "max_new_tokens": gen.max_new_tokens,
                "temperature": gen.temperature,
                "grad_clip": cfg.train.grad_clip,
                "eps_clip": cfg.train.eps_clip,
                "eps_clip_higher": cfg.train.eps_clip_higher,
                "ppo_epochs": cfg.train.ppo_epochs,
                "beta": 0.0,
                "threads": args.threads,
                "out_dir": str(run_dir),
                "reward_fn": cfg.dataset.reward_fn,
                "snapshot_steps": args.snapshot_steps,
            }
            spec_path.write_text(json.dumps(spec))
            _run([str(TRL_PY), "bench/peer_trl.py", str(spec_path)], run_dir / "log.txt", args.threads)
        else:
            sync = system == "rollflow-sync"
            spec = {
                "config": args.config,
                "overrides": common,
                "seed": seed,
                "seconds": args.sync_seconds if sync else args.seconds,
                "max_steps": args.max_steps,
                "snapshot_every_s": args.snapshot_every,
                "snapshot_steps": args.snapshot_steps,
                "out_dir": str(run_dir),
                "sync": sync,
                "threads": cfg.train.threads,
                "rollout_process": args.rollout_process,
            }
            spec_path.write_text(json.dumps(spec))
            _run(
                [sys.executable, "-m", "bench.peer_rollflow", str(spec_path)],
                run_dir / "log.txt",
                args.threads,
            )
        doc = _curve(run_dir, scorer, base_correct)
        doc["system"], doc["seed"], doc["wall_s"] = system, seed, time.monotonic() - t0
        runs.append(doc)
        final = doc["curve"][-1]
        # after every run, so a stopped benchmark keeps what it measured ("partial": the summary comes last)
        _write_doc(out, name, args, base_acc, len(eval_rows), {}, runs, partial=True)
        print(
            f"# {system} seed {seed}: {doc['steps']} steps in {doc['train_seconds']:.0f} s, "
            f"{doc['completions_per_s']:.0f} completions/s, acc {final[1]:.3f} at {final[0]:.0f} s",
            flush=True,
        )

    summary = summarize(runs, args.seconds, args.snapshot_steps)
    for k, v in summary.items():
        print(f"{k} {v}")
    for line in timing_lines(runs):
        print(line)
    _write_doc(out, name, args, base_acc, len(eval_rows), summary, runs, partial=False)
    plot(runs, out / f"peer_{name}.png", title=f"{name}: greedy held-out accuracy ({len(eval_rows)} prompts)")
    print(f"# wrote {out / f'peer_{name}.json'} and .png", flush=True)
    return 0


def _write_doc(
    out: Path,
    name: str,
    args: argparse.Namespace,
    base_acc: float,
    n_eval: int,
    summary: dict[str, str],
    runs: list[dict[str, Any]],
    *,
    partial: bool,
) -> None:
    """Write ``out/peer_<name>.json``: the runs so far, and the summary once every run is in."""
    doc = {
        "config": args.config,
        "overrides": args.overrides,
        "seconds": args.seconds,
        "threads": args.threads,
        "base_acc": base_acc,
        "n_eval": n_eval,
        "partial": partial,
        "summary": summary,
        "runs": runs,
    }
    tmp = out / f".peer_{name}.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / f"peer_{name}.json")


def _fmt(x: float) -> str:
    return "none" if not math.isfinite(x) else f"{x:.3f}"


PER_STEP = (500, 1000, 1500)  # optimizer steps of the per-step comparison (issue 17)


def per_step_keys(by: dict[str, list[dict[str, Any]]], steps: Sequence[int] = PER_STEP) -> dict[str, str]:
    """Accuracy at optimizer step N of each system in ``by`` (runs by system), and rollflow's over TRL's.

    For N in ``steps``: ``{system}_acc_at_step_{N}``, the median over the runs that reached step N
    (``none`` if none did); with both systems, ``per_step_acc_ratio_at_{N}`` = median(rollflow) /
    median(TRL), ``none`` unless every run of both reached N (a median over the faster seeds alone would
    flatter the slower system) or when TRL's median is 0; its ``_spread`` is min..max of the per-seed
    ratios (same seed, both reached N, TRL's accuracy > 0).
    """
    out: dict[str, str] = {}
    systems = [name for name in ("trl", "rollflow") if by.get(name)]
    for n in steps:
        at = {name: {r["seed"]: r.get("step_acc", {}).get(str(n)) for r in by[name]} for name in systems}
        for name, by_seed in at.items():
            reached = [a for a in by_seed.values() if a is not None]
            out[f"{name}_acc_at_step_{n}"] = _fmt(median(reached)) if reached else "none"
            out[f"{name}_acc_at_step_{n}_spread"] = spread(reached)
        if len(systems) < 2:
            continue
        trl, rollflow = at["trl"], at["rollflow"]
        ratio = math.nan
        if all(a is not None for a in [*trl.values(), *rollflow.values()]):
            denominator = median(list(trl.values()))
            ratio = median(list(rollflow.values())) / denominator if denominator > 0 else math.nan
        paired = [rollflow[seed] / a for seed, a in trl.items() if a and rollflow.get(seed) is not None]
        out[f"per_step_acc_ratio_at_{n}"] = _fmt(ratio)
        out[f"per_step_acc_ratio_at_{n}_spread"] = spread(paired)
    return out


def completions_to(run: dict[str, Any], threshold: float) -> float:
    """Completions generated until the first snapshot at or above ``threshold`` (NaN if none reached it).

    Learning per generated token, blind to the machine's speed: snapshot step x completions generated
    per step (``completions`` counts every generated one, the groups dynamic sampling dropped included).
    """
    reached = [int(k) for k, a in run.get("step_acc", {}).items() if a is not None and a >= threshold]
    if not reached:
        return math.nan
    return min(reached) * run["completions"] / max(1, run["steps"])


def min_after(run: dict[str, Any], threshold: float) -> float:
    """The lowest held-out accuracy of any snapshot after the first one at or above ``threshold`` (NaN if
    none reached it): how well a run holds what it learned."""
    curve = [a for _, a in sorted(run.get("curve", [])) if a is not None]
    first = next((i for i, a in enumerate(curve) if a >= threshold), None)
    return math.nan if first is None else min(curve[first:])


def per_token_keys(by: dict[str, list[dict[str, Any]]], threshold: float = 0.8) -> dict[str, str]:
    """``{system}_completions_to_{threshold}``: the median over the runs that got there, and how many did;
    ``{system}_min_acc_after_{threshold}``: the median of those runs' lowest accuracy after it."""
    out: dict[str, str] = {}
    for system in ("trl", "rollflow"):
        got = [c for c in (completions_to(r, threshold) for r in by.get(system, [])) if math.isfinite(c)]
        held = [m for m in (min_after(r, threshold) for r in by.get(system, [])) if math.isfinite(m)]
        if by.get(system):
            out[f"{system}_completions_to_{threshold}"] = _fmt(median(got)) if got else "none"
            out[f"{system}_completions_to_{threshold}_spread"] = spread(got)
            out[f"{system}_runs_reaching_{threshold}"] = f"{len(got)}/{len(by[system])}"
            out[f"{system}_min_acc_after_{threshold}"] = _fmt(median(held)) if held else "none"
            out[f"{system}_min_acc_after_{threshold}_spread"] = spread(held)
    return out


def summarize(runs: list[dict[str, Any]], seconds: float, steps: Sequence[int] = PER_STEP) -> dict[str, str]:
    """The printed ``key value`` figures (medians over seeds; ``_spread`` keys give min..max)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["system"], []).append(r)
    out: dict[str, str] = {}
    s = int(seconds)
    for system in ("trl", "rollflow"):
        rs = by.get(system, [])
        if not rs:
            continue
        cps = [r["completions_per_s"] for r in rs]
        acc = [value_at(r["curve"], seconds, final_from=seconds) for r in rs]
        sps = [r["train_seconds"] / max(1, r["steps"]) for r in rs]
        out[f"{system}_completions_per_s"] = _fmt(median(cps))
        out[f"{system}_completions_per_s_spread"] = spread(cps)
        out[f"{system}_s_per_step"] = _fmt(median(sps))
        out[f"{system}_acc_at_{s}s"] = _fmt(median(acc))
        out[f"{system}_acc_at_{s}s_spread"] = spread(acc)
        for i, half in ((1, "solved"), (2, "unsolved")):  # retention and learning (bench.peer_eval)
            at = [
                value_at([(p[0], p[i]) for p in r.get("retention", [])], seconds, final_from=seconds)
                for r in rs
            ]
            out[f"{system}_acc_base_{half}_at_{s}s"] = _fmt(median(at))
    if "trl" in by and "rollflow" in by:
        trl_cps = median([r["completions_per_s"] for r in by["trl"]])
        out["completions_per_s_ratio"] = _fmt(
            median([r["completions_per_s"] for r in by["rollflow"]]) / trl_cps
        )
        target = median([value_at(r["curve"], seconds, final_from=seconds) for r in by["trl"]])
        times = [time_to(r["curve"], target) for r in by["rollflow"]]
        out["time_to_trl_final_ratio"] = _fmt(median(times) / seconds)
        out["time_to_trl_final_spread"] = spread(times)
    out.update(per_step_keys(by, steps))
    out.update(per_token_keys(by))
    if "rollflow" in by:
        times = [time_to(r["curve"], 0.8) for r in by["rollflow"]]
        out["rollflow_time_to_0.8"] = _fmt(median(times))
        out["rollflow_time_to_0.8_spread"] = spread(times)
    if "rollflow" in by and "rollflow-sync" in by:
        async_sps = median([r["train_seconds"] / max(1, r["steps"]) for r in by["rollflow"]])
        sync = by["rollflow-sync"]
        sync_sps = median([r["train_seconds"] / max(1, r["steps"]) for r in sync])
        out["rollflow_sync_s_per_step"] = _fmt(sync_sps)
        out["async_vs_sync_step_ratio"] = _fmt(sync_sps / async_sps)
        # generation (rollout busy) + training (compute + checkpoint) per synchronous step
        parts = []
        for r in sync:
            n = max(1, r["steps"])
            busy = r.get("rollout_busy_s") or 0.0
            train = sum(r["compute_s"]) + sum(r["checkpoint_s"])
            parts.append((r["train_seconds"] / n) / ((busy + train) / n))
        out["sync_step_vs_gen_plus_train"] = _fmt(median(parts))
    for system in ("rollflow", "rollflow-sync"):
        out.update(timing_keys(system, by.get(system, [])))
    return out


TIMING_KEYS = {
    "core_busy_min": "time/cpu/busy_frac_min",
    "trainer_waiting_data_frac": "time/trainer/waiting_data_frac",
    "rollout_capacity_wait_frac": "time/rollout/capacity_wait_frac",
    "rollout_paused_frac": "time/rollout/paused_frac",
    # the rollout's other named waits (rollflow.clock.roles): no "idle" without a cause
    "rollout_flush_wait_frac": "time/rollout/flush_wait_frac",
    "rollout_claim_wait_frac": "time/rollout/claim_wait_frac",
    "rollout_idle_frac": "time/rollout/idle_frac",
    "server_busy_frac": "time/server0/busy_frac",
}


def timing_keys(system: str, rs: list[dict[str, Any]]) -> dict[str, str]:
    """Where ``system``'s time went over its seeds (runs without a ``timing`` record are skipped)."""
    out: dict[str, str] = {}
    timed = [r for r in rs if r.get("timing")]
    for key, metric in TIMING_KEYS.items():
        values = [float(r["timing"][metric]) for r in timed if metric in r["timing"]]
        if values:
            out[f"{system}_{key}"] = _fmt(median(values))
            out[f"{system}_{key}_spread"] = spread(values)
    return out


def timing_lines(runs: list[dict[str, Any]]) -> list[str]:
    """``# {system} time: ...`` for the seed with the median number of steps of each timed system."""
    lines = []
    for system in ("rollflow", "rollflow-sync"):
        rs = sorted(
            (r for r in runs if r["system"] == system and r.get("time_bounds")), key=lambda r: r["steps"]
        )
        if rs:
            lines.append(
                f"# {system} time (seed {rs[len(rs) // 2]['seed']}): {rs[len(rs) // 2]['time_bounds']}"
            )
    return lines


def plot(runs: list[dict[str, Any]], path: Path, *, title: str) -> None:
    """Left: accuracy against training seconds (the race); right: against optimizer steps (per-step
    learning, where TRL and rollflow's synchronous baseline should overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"trl": "tab:orange", "rollflow": "tab:blue", "rollflow-sync": "tab:gray"}
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120, sharey=True)
    seen: set[str] = set()
    for r in runs:
        xs, ys = zip(*r["curve"], strict=True)
        label = None if r["system"] in seen else r["system"]
        seen.add(r["system"])
        style = {"color": colors.get(r["system"], "k"), "alpha": 0.8, "lw": 1.4, "marker": "."}
        ax_t.plot(xs, ys, label=label, **style)
        steps = [0] + [int(s["step"]) for s in r["snapshots"] if s.get("file") and s["t"] > 0]
        if len(steps) == len(ys):
            ax_s.plot(steps, ys, **style)
    ax_t.set_xlabel("training seconds (evaluation excluded)")
    ax_s.set_xlabel("optimizer steps")
    ax_t.set_ylabel("greedy held-out accuracy")
    for ax in (ax_t, ax_s):
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    ax_t.legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
