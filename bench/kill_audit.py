"""Kill audit: stop a real tiny run at random moments, resume it each time, then account for every prompt.

What it is. ``run_kill_audit`` starts ``python -m flows.async_rl`` on the tiny config (a real flow process
with its private Prefect API, CPU server and reward workers), waits for its rollout to start, sends it
SIGKILL (``--sigterm``: SIGTERM, a graceful stop) after a random delay, resumes the trial with
``--resume``, and repeats ``--kills`` times; the last life runs to the end (training done, trial
finalized). The SIGKILLs take turns over ``--points``: a random moment; right after a commit record is
put, before the state put that follows it; right after a block claim, before its state put (those two
lives run through this module's ``--life`` launcher, which installs ``install_kill_point`` in the flow
process: the process kills itself at its n-th commit or claim, n drawn from 1-4). For those, the driver
also reads what the kill left (``claims_unrecorded_at_kills``, ``positions_committed_but_open_at_kills``)
and checks a later life ran the unrecorded blocks. Then ``bench.prompt_audit.audit_trial`` reads the trial's storage, and nothing else, and
checks:

    positions handed out = committed + dropped (a recorded drop) + open at the end (in a state file)

per prompt position, with nothing generated twice into committed shards, no group trained twice or
trained without being committed, and the final checkpoint and ``FINALIZED.json`` written.

Run:  .venv/bin/python -m bench.kill_audit                  (5 SIGKILLs, 4-6 minutes on 2 cores)
      .venv/bin/python -m bench.kill_audit --kills 10       (the 10-kill audit: 4 random, 3 commit, 3 claim)
      .venv/bin/python -m bench.kill_audit --kills 2 --quick
      .venv/bin/python -m bench.kill_audit --sigterm        (graceful stops: SIGTERM, then resume)
      .venv/bin/python -m bench.kill_audit --audit-only --trial T [--config C] [dotted.overrides ...]

It prints ``key value`` lines (``kills``, ``positions_*``, ``groups_trained_twice``,
``recovery_stall_s_to_{commit,step}_{median,range}``, ``final_committed``, ...), then one
``problem ...`` line per inconsistency found, and exits 1 if the audit failed, a block open at a stop
was never taken over, or a process outlived its life. A run also writes
``bench/results/kill_audit[_sigterm].json`` (per-life details beside the figures) unless ``--no-save``.

What the audit reads, and what storage does not record (a drop's position and reason):
``bench.prompt_audit``.
``recovery_stall_s`` is measured by the driver, not the audit: from the restarted process's start to
the first commit record it wrote (``created_at``) and to the first ``consumed/step`` file it wrote (the
file's mtime: local storage only).

What it is not: a test (``tests/recovery/`` asserts on it). The driver runs on local storage only (its
timings read file times); the audit reads through ``storage.fs.Storage`` (not tried on S3).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.prompt_audit import CONSUMED_DIR, Audit, audit_config

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
CONFIG = "configs/tiny_cpu.yaml"
STATE_FILE = "rollout/state-rollout-w0.json"  # the embedded run's one worker
TAKEOVERS = "prompts/takeovers"


@dataclass
class Life:
    """One process of the trial: started, maybe stopped, and what storage shows it did."""

    index: int
    started_at: float  # unix seconds, just before the process started
    stopped_by: str = "-"  # SIGKILL | SIGTERM | SIGTERM+SIGKILL (its grace ran out) | - (ran to its end)
    # | SIGKILL@commit | SIGKILL@claim (killed itself at that exact point, see install_kill_point)
    kill_point: str = "random"
    unrecorded_claims: list[int] = field(default_factory=list)  # its claims its state file never named
    committed_open: int = 0  # positions its state file left open that a commit record names
    stop_delay_s: float | None = None  # after its rollout started (see _stop_at_random)
    exit_s: float | None = None  # from the signal to the process's exit (SIGTERM)
    rc: int | None = None
    first_commit_s: float | None = None  # from started_at to its first commit record
    first_step_s: float | None = None  # from started_at to its first consumed/step file
    blocks_adopted: int = 0  # takeover records it wrote (its predecessor's open blocks)
    version_reached: int | None = None  # the newest step it trained (consumed/step files it wrote)
    resume_point: int | None = None  # the newest resume point in storage when it ended
    open_at_end: dict[str, int] = field(
        default_factory=dict
    )  # its state file's open blocks -> open positions
    held_gens: dict[str, int] = field(default_factory=dict)  # its state file's open blocks -> generation
    not_adopted: list[str] = field(default_factory=list)  # blocks open at its stop never taken over later
    orphans: int = 0


KILL_POINTS = ("random", "commit", "claim")  # when a stop lands (see install_kill_point)


def install_kill_point(point: str, nth: int) -> None:
    """A test hook, installed only in a process this driver (or a test) starts, never in the production
    path: SIGKILL this process at an exact moment of its rollout loop.

    - ``commit``: right after its ``nth`` commit record is put, before the state put that follows it (a
      group committed, its position still open in the state file);
    - ``claim``: right after its ``nth`` successful block claim, before ``on_claim``'s state put (a block
      claimed that the state file never names).
    """
    from storage.prompt_claims import ClaimLog
    from storage.shard_writer import ShardWriter

    seen = [0]

    def hit() -> None:
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)

    if point == "commit":
        commit = ShardWriter._commit

        def _commit(self: ShardWriter, pending: Any) -> Any:
            record = commit(self, pending)
            hit()
            return record

        ShardWriter._commit = _commit  # type: ignore[method-assign]
    elif point == "claim":
        try_claim = ClaimLog.try_claim

        def _try_claim(self: ClaimLog, block: int, worker: str, name: str) -> bool:
            won = try_claim(self, block, worker, name)
            if won:
                hit()
            return won

        ClaimLog.try_claim = _try_claim  # type: ignore[method-assign]
    else:
        raise ValueError(f"kill point must be 'commit' or 'claim', got {point!r}")


def _tagged(tag: str) -> list[int]:
    """PIDs of the processes that carry ``tag`` in their environment (what this script started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if tag.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _reap(tag: str, seconds: float = 60.0) -> int:
    """Wait for this life's processes to go; SIGKILL any left after ``seconds``; return how many were left."""
    deadline = time.monotonic() + seconds
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def _firsts(trial_dir: Path, since: float) -> tuple[float | None, float | None]:
    """Seconds from ``since`` to the first commit record created and the first step file written after it."""
    commits = []
    for f in (trial_dir / "trajectories" / "commits").glob("v*/*.json"):
        with contextlib.suppress(OSError, ValueError):
            t = float(json.loads(f.read_text())["created_at"])
            if t >= since:
                commits.append(t)
    steps = [m for f in (trial_dir / CONSUMED_DIR).glob("step-*.json") if (m := f.stat().st_mtime) >= since]
    return (min(commits) - since if commits else None), (min(steps) - since if steps else None)


def _progress(trial_dir: Path, since: float) -> tuple[int | None, int | None]:
    """The newest step trained since ``since`` (step files it wrote) and the newest resume point."""
    steps = [
        int(f.stem[5:]) for f in (trial_dir / CONSUMED_DIR).glob("step-*.json") if f.stat().st_mtime >= since
    ]
    points = [int(f.stem[6:]) for f in (trial_dir / "trainer").glob("state-*.json")]
    return (max(steps) if steps else None), (max(points) if points else None)


def _spread(xs: list[float]) -> tuple[str, str]:
    if not xs:
        return "-", "-"
    return f"{statistics.median(xs):.1f}", f"{min(xs):.1f}-{max(xs):.1f}"


def run_kill_audit(
    *,
    kills: int = 5,
    sigterm: bool = False,
    steps: int | None = None,
    window_s: float = 10.0,
    seed: int = 0,
    workdir: Path | None = None,
    extra: Sequence[str] = (),
    graces: Sequence[float] = (),
    points: Sequence[str] = ("random",),
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> tuple[dict[str, Any], Audit, list[Life]]:
    """Run, stop ``kills`` times at random moments, resume, finish; then audit. Returns (figures, audit, lives).

    A stop comes ``uniform(0, window_s)`` seconds after the life's rollout started (its first takeover
    or state file, so also in the moments after it took its predecessor's blocks over). ``graces[i]``
    (default 120 s) is how long stop ``i`` may take before a SIGKILL follows. ``steps`` (default ``20 * kills``) should
    outlast the stops; a life that finishes before its stop ends the stopping early (``kills`` says how
    many stops happened).
    """
    rng = random.Random(seed)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="kill-audit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trial = f"kill-audit-{seed}"
    steps = steps if steps is not None else max(20, 20 * kills)
    overrides = [
        f"train.steps={steps}", "train.resume_every=2", "eval.every_n_versions=0", "eval.n_prompts=16",
        f"storage.root={workdir / 'storage'}", f"storage.local_cache={workdir / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{workdir / 'mlflow.db'}", *extra,
    ]  # fmt: skip
    trial_dir = workdir / "storage" / "tiny-arith" / trial
    sig = signal.SIGTERM if sigterm else signal.SIGKILL
    lives: list[Life] = []
    t0 = time.monotonic()
    for i in range(kills + 1):
        life = Life(index=i, started_at=time.time())
        lives.append(life)
        tag = f"ROLLFLOW_KILL_AUDIT={os.getpid()}-{i}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
        env.update(
            PREFECT_HOME=str(workdir / "prefect"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
            DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true", PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",  # a killed life's log keeps its last lines
        )  # fmt: skip
        env[tag.split("=")[0]] = tag.split("=")[1]
        resume = ["--resume"] if i > 0 else []
        point = points[i % len(points)] if i < kills else "random"
        life.kill_point = point
        launcher = ["flows.async_rl"]
        if point != "random":  # the life kills itself at its nth commit / claim (n drawn here)
            launcher = ["bench.kill_audit", "--life", f"{point}:{rng.randint(1, 4)}", "--"]
        cmd = [sys.executable, "-m", *launcher, "--config", CONFIG, "--trial", trial, *resume]
        cmd += overrides
        log_path = workdir / f"life-{i}.log"
        seen = _takeovers(trial_dir), _incarnation(trial_dir)

        def started(seen: tuple[set[str], str | None] = seen) -> bool:
            """This life's rollout began: it took blocks over, or its state file names a new incarnation."""
            return bool(_takeovers(trial_dir) - seen[0]) or _incarnation(trial_dir) not in (None, seen[1])

        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            if i < kills and point == "random":
                grace = graces[i] if i < len(graces) else 120.0
                _stop_at_random(proc, started, life, sig, rng, window_s, grace)
            life.rc = proc.wait(timeout=900)
            if point != "random" and life.rc == -signal.SIGKILL:
                life.stopped_by = f"SIGKILL@{point}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            life.orphans = _reap(tag)
        life.blocks_adopted = len(_takeovers(trial_dir) - seen[0])
        life.version_reached, life.resume_point = _progress(trial_dir, life.started_at)
        held = _held(trial_dir)
        life.open_at_end = {b: len(info["open"]) for b, info in held.items()}
        life.held_gens = {b: int(info["gen"]) for b, info in held.items()}
        life.unrecorded_claims, life.committed_open = _window(trial_dir, held)
        if i > 0:
            life.first_commit_s, life.first_step_s = _firsts(trial_dir, life.started_at)
        say(f"life {i}: {asdict(life)}")
        if life.stopped_by == "-" and i < kills:  # it finished before its stop: nothing more to stop
            break
    final = lives[-1]
    if final.stopped_by != "-" or final.rc != 0:  # the last stop happened: resume once more to the end
        raise RuntimeError(f"the trial did not run to its end: {asdict(final)}; logs in {workdir}")
    audit = audit_config(CONFIG, [*overrides, f"trial={trial}"])
    restarted = lives[1:]
    commit_med, commit_range = _spread([x.first_commit_s for x in restarted if x.first_commit_s is not None])
    step_med, step_range = _spread([x.first_step_s for x in restarted if x.first_step_s is not None])
    stopped = [x for x in lives if x.stopped_by != "-"]
    gens = collections.defaultdict(set)  # block -> generations it was taken over at
    for name in _takeovers(trial_dir):  # {block:010d}-{gen:03d}.json
        gens[int(name[:10])].add(int(name[11:14]))
    for x in stopped:  # every block open at a stop must have been taken over later, at a newer generation
        x.not_adopted = [b for b, g in x.held_gens.items() if not any(h > g for h in gens[int(b)])]
        x.not_adopted += [str(b) for b in x.unrecorded_claims if not gens[b]]  # claimed, never named
    retrained = [x.version_reached - (x.resume_point or 0) for x in stopped if x.version_reached is not None]
    figures: dict[str, Any] = {
        "kills": len(stopped),
        "signal": sig.name,
        "kills_right_after_commit": sum(x.stopped_by == "SIGKILL@commit" for x in stopped),
        "kills_right_after_claim": sum(x.stopped_by == "SIGKILL@claim" for x in stopped),
        "claims_unrecorded_at_kills": sum(len(x.unrecorded_claims) for x in stopped),
        "positions_committed_but_open_at_kills": sum(x.committed_open for x in stopped),
        "positions_handed_out": audit.positions_handed_out,
        "positions_committed": audit.positions_committed,
        "positions_dropped": audit.positions_dropped,
        "positions_open_at_end": audit.positions_open_at_end,
        "positions_unaccounted": audit.positions_unaccounted,
        "positions_generated_twice": audit.positions_generated_twice,
        "groups_trained_twice": audit.groups_trained_twice,
        "groups_trained_not_committed": audit.groups_trained_not_committed,
        "groups_dropped_stale_by_trainer": audit.groups_dropped_stale_by_trainer,
        "blocks_adopted": audit.blocks_adopted,
        "steps_trained_again": sum(retrained),  # past the newest resume point at each stop
        "positions_open_at_stops": sum(sum(x.open_at_end.values()) for x in stopped),
        "blocks_not_adopted_after_stops": sum(len(x.not_adopted) for x in lives),
        "recovery_stall_s_to_commit_median": commit_med,
        "recovery_stall_s_to_commit_range": commit_range,
        "recovery_stall_s_to_step_median": step_med,
        "recovery_stall_s_to_step_range": step_range,
        "restarts_measured": f"{sum(x.first_commit_s is not None for x in restarted)}/{len(restarted)}",
        "final_version": audit.final_version,
        "final_committed": int(audit.final_committed),
        "orphans_left": sum(x.orphans for x in lives),
        "wall_s": round(time.monotonic() - t0),
    }
    if sigterm:
        exits = [x.exit_s for x in stopped if x.exit_s is not None]
        figures["exit_after_sigterm_s_median"], figures["exit_after_sigterm_s_range"] = _spread(exits)
    return figures, audit, lives


def _held(trial_dir: Path) -> dict[str, Any]:
    """The open blocks of the worker's state file: ``{block: {"gen", "open"}}``."""
    try:
        return dict(json.loads((trial_dir / STATE_FILE).read_text()).get("blocks") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def _window(trial_dir: Path, held: dict[str, Any]) -> tuple[list[int], int]:
    """What a kill left between a storage write and the state put after it: the worker's claims at or
    after its state's ``claim_mark`` (blocks the state never named), and the positions its state lists
    as open that a commit record names (committed before the state put). A resume must run the former
    and skip the latter."""
    try:
        state = json.loads((trial_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return [], 0
    mark, name = state.get("claim_mark"), state.get("writer")
    unrecorded = []
    for f in (trial_dir / "prompts" / "claims").glob("*/*.json"):
        with contextlib.suppress(OSError, ValueError):
            block = int(f.stem)
            if mark is not None and block >= mark and json.loads(f.read_text()).get("name") == name:
                unrecorded.append(block)
    committed: set[int] = set()
    for f in (trial_dir / "trajectories" / "commits").glob("v*/*.json"):
        with contextlib.suppress(OSError, ValueError):
            committed.update(json.loads(f.read_text()).get("positions") or ())
    open_now = {p for info in held.values() for p in info.get("open", [])}
    return sorted(unrecorded), len(open_now & committed)


def _takeovers(trial_dir: Path) -> set[str]:
    return {f.name for f in (trial_dir / TAKEOVERS).glob("*.json")}


def _incarnation(trial_dir: Path) -> str | None:
    try:
        return str(json.loads((trial_dir / STATE_FILE).read_text())["incarnation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stop_at_random(
    proc: subprocess.Popen[bytes],
    started: Callable[[], bool],
    life: Life,
    sig: signal.Signals,
    rng: random.Random,
    window_s: float,
    grace_s: float = 120.0,
) -> None:
    """Send ``sig`` ``uniform(0, window_s)`` s after ``started()`` turns true (if the process still runs),
    and SIGKILL it if it has not exited ``grace_s`` later (a preemption's grace running out).

    The rollout's start is read from storage (polled every 20 ms): its first takeover record, or else
    the first state file of its incarnation (written at its first claim), so a stop can also land in
    the moments between a takeover and the state file that records it.
    """
    deadline = time.monotonic() + 600
    while not started():
        if proc.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the rollout never started")
        time.sleep(0.02)
    delay = rng.uniform(0.0, window_s)
    time.sleep(delay)
    if proc.poll() is not None:
        return
    sent = time.monotonic()
    proc.send_signal(sig)
    life.stopped_by, life.stop_delay_s = sig.name, round(delay, 2)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:  # the grace ran out (or a graceful stop hangs): kill it
        proc.kill()
        proc.wait()
        life.stopped_by = f"{sig.name}+SIGKILL"
    life.exit_s = round(time.monotonic() - sent, 2)


def print_report(figures: dict[str, Any], audit: Audit) -> None:
    for k, v in figures.items():
        print(f"{k} {v}", flush=True)
    for p in audit.problems:
        print(f"problem {p}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--life"]:  # one life of the trial, killing itself at an exact point (the driver's)
        point, nth = argv[1].split(":")
        install_kill_point(point, int(nth))
        from flows.async_rl import main as flow_main

        return flow_main(argv[3:] if argv[2:3] == ["--"] else argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5, help="stops before the last life (default 5)")
    ap.add_argument("--sigterm", action="store_true", help="stop with SIGTERM (graceful) instead of SIGKILL")
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default 20 per stop)")
    ap.add_argument(
        "--window-s", type=float, default=10.0, help="a stop comes uniform(0, this) s after rollout start"
    )
    ap.add_argument(
        "--points",
        default="random,commit,claim",
        help="where the SIGKILLs land, in turn: random (uniform in the window), commit (right after a "
        "commit record, before the state put), claim (right after a block claim, before its state put); "
        "--sigterm stops at random only",
    )
    ap.add_argument("--quick", action="store_true", help="window 4 s, 15 steps per stop")
    ap.add_argument("--seed", type=int, default=0, help="seeds the stop moments and names the trial")
    ap.add_argument("--workdir", type=Path, default=None, help="storage, logs, MLflow (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway if the audit fails)")
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results/kill_audit*.json")
    ap.add_argument("--audit-only", action="store_true", help="only audit --trial of --config")
    ap.add_argument("--trial", default=None)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("overrides", nargs="*", help="dotted overrides for the run (or for --audit-only)")
    args = ap.parse_args(argv)

    if args.audit_only:
        audit = audit_config(args.config, [*args.overrides, *([f"trial={args.trial}"] if args.trial else [])])
        figures = {k: v for k, v in asdict(audit).items() if k != "problems"}
        print_report(figures, audit)
        return 0 if audit.ok else 1

    window = 4.0 if args.quick else args.window_s
    steps = args.steps if args.steps is not None else (max(15, 15 * args.kills) if args.quick else None)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill-audit-"))
    figures, audit, lives = run_kill_audit(
        kills=args.kills, sigterm=args.sigterm, steps=steps, window_s=window, seed=args.seed,
        workdir=workdir, extra=args.overrides,
        points=("random",) if args.sigterm else tuple(args.points.split(",")),
    )  # fmt: skip
    print_report(figures, audit)
    passed = audit.ok and figures["blocks_not_adopted_after_stops"] == 0 and figures["orphans_left"] == 0
    if not args.no_save:
        name = "kill_audit_sigterm" if args.sigterm else "kill_audit"
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        doc = {"figures": figures, "audit": asdict(audit), "lives": [asdict(x) for x in lives]}
        (RESULTS_DIR / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    if passed and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"workdir {workdir}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
