"""Auto-resume bench: SIGKILL a deployment's flow-run process mid-training, and let Prefect resume it.

What it is. ``run_auto_resume`` deploys ``prefect.yaml`` (its ``async-rl/local`` deployment carries the
auto-resume trigger), starts a process worker, runs the deployment on the tiny config with a named
trial, and ``kills`` times: waits until the newest life has trained a step, SIGKILLs the flow-run
process (found by its ``PREFECT__FLOW_RUN_ID``), and waits for training to go on. Nobody calls resume:
the worker marks the run Crashed, the trigger runs the deployment with ``auto_resume_of``, and the new
run resumes the trial. At the end the trial must be finished and ``bench.prompt_audit`` must find it
clean from storage alone. It prints ``key value`` lines:

    recovery_s_{i}        kill -> the first step trained after it (a consumed/step file newer than the kill)
    recovery_s_median     and _range over the kills
    flow_runs             the deployment's runs of the trial (1 + kills when nothing else failed)
    auto_resumes          entries in the trial's orchestration/auto-resumes.json
    staleness_max         the stalest trained group (step - 1 - head_version), from trainer/consumed/
    staleness_held        staleness_max <= rollout.max_staleness (staleness_bound)
    audit_ok, positions_*, groups_trained_twice, final_version

Run:  .venv/bin/python -m bench.auto_resume [--kills 3] [--steps 40]     (its own Prefect server; ~4 min)
The test (``tests/recovery/test_auto_resume.py``) runs three kills against the session's Prefect server.

What it is not: a staleness or throughput bench; the kill moments are "after a step", not random.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.prefect_local import BIN, ROOT, deploy_local, start_worker, stop_worker, wait_http
from bench.prefect_local import prefect_cli as _prefect

CONFIG = "configs/tiny_cpu.yaml"
DEPLOYMENT = "async-rl/local"


def flow_run_pids(flow_run_id: str) -> list[int]:
    """PIDs of processes started for ``flow_run_id`` by a process worker (its ``PREFECT__FLOW_RUN_ID``)."""
    mark = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return sorted(pids)


def _steps_after(trial_dir: Path, t: float) -> list[float]:
    """mtimes of the consumed/step files written after unix time ``t``."""
    d = trial_dir / "trainer" / "consumed"
    if not d.is_dir():
        return []
    return sorted(m for f in d.iterdir() if (m := f.stat().st_mtime) > t)


def _runs_of(client: Any, trial: str) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"async-rl-{trial}"]))
    )
    return sorted(runs, key=lambda r: r.created)


def run_auto_resume(
    env: dict[str, str],
    workdir: Path,
    *,
    kills: int = 1,
    steps: int = 16,
    trial: str = "autoheal",
    say: Callable[[str], None] = print,
    timeout_s: float = 900,
) -> tuple[dict[str, Any], Any]:
    """Deploy, start a worker, run, SIGKILL ``kills`` times, let it finish; ``(figures, audit)``.

    ``env`` points at a running Prefect server (``PREFECT_API_URL``); the worker is stopped at the end.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from bench.prompt_audit import audit_config

    overrides = [
        f"storage.root={workdir / 'storage'}",
        f"storage.local_cache={workdir / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{workdir / 'mlflow' / 'mlflow.db'}",
        f"train.steps={steps}",
        "train.resume_every=2",
        "eval.n_prompts=32",
        "eval.every_n_versions=0",
        f"trial={trial}",
    ]
    trial_dir = workdir / "storage" / "tiny-arith" / trial
    deploy_local(env)
    worker = start_worker(env, workdir / "worker.log")
    figures: dict[str, Any] = {}
    recoveries: list[float] = []
    deadline = time.monotonic() + timeout_s
    try:
        out = _prefect(
            env, "deployment", "run", DEPLOYMENT, "--param", f"overrides={json.dumps(overrides)}",
        )  # fmt: skip
        first_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
        say(f"started flow run {first_id} (trial {trial})")
        with (
            temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}),
            get_client(sync_client=True) as pc,
        ):
            current = first_id
            for i in range(kills):
                seen = len(_steps_after(trial_dir, 0))
                while len(_steps_after(trial_dir, 0)) <= seen + (1 if i == 0 else 0):
                    _check_time(deadline, workdir, "a step before kill")
                    time.sleep(0.2)
                pids = flow_run_pids(current)
                if not pids:
                    raise RuntimeError(f"no process of flow run {current} found to kill")
                killed_at = time.time()
                for pid in pids:  # the flow-run process (and anything else that carries its id)
                    os.kill(pid, signal.SIGKILL)
                trained = len(_steps_after(trial_dir, 0))
                say(f"kill {i + 1}: SIGKILL {pids} of {current} with {trained} steps trained")
                while not _steps_after(trial_dir, killed_at):
                    _check_time(deadline, workdir, "training again after the kill")
                    time.sleep(0.2)
                recoveries.append(_steps_after(trial_dir, killed_at)[0] - killed_at)
                say(f"recovery_s_{i + 1} {recoveries[-1]:.1f}")
                runs = _runs_of(pc, trial)
                current = str(runs[-1].id)
            while True:  # the last life runs to the end
                _check_time(deadline, workdir, "the trial to finish")
                run = pc.read_flow_run(current)
                if run.state is not None and run.state.is_final():
                    break
                time.sleep(1.0)
            runs = _runs_of(pc, trial)
            figures["final_state"] = run.state.name if run.state else None
            figures["flow_runs"] = len(runs)
            figures["auto_resumed"] = sum(1 for r in runs if r.parameters.get("auto_resume_of"))
            figures["states"] = ",".join(r.state.name if r.state else "?" for r in runs)
    finally:
        stop_worker(worker)
    budget = json.loads((trial_dir / "orchestration" / "auto-resumes.json").read_text())
    figures["auto_resumes"] = len(budget["resumes"])
    for i, r in enumerate(recoveries, 1):
        figures[f"recovery_s_{i}"] = round(r, 1)
    if recoveries:
        figures["recovery_s_median"] = round(statistics.median(recoveries), 1)
        figures["recovery_s_range"] = f"{min(recoveries):.1f}-{max(recoveries):.1f}"
    figures.update(staleness_from_storage(trial_dir, _max_staleness(overrides)))
    audit = audit_config(CONFIG, overrides)
    figures.update(
        audit_ok=audit.ok,
        positions_handed_out=audit.positions_handed_out,
        positions_unaccounted=audit.positions_unaccounted,
        positions_generated_twice=audit.positions_generated_twice,
        groups_trained_twice=audit.groups_trained_twice,
        final_version=audit.final_version,
    )
    return figures, audit


def _max_staleness(overrides: list[str]) -> int:
    from rollflow.configuration.loader import load_config

    return load_config(CONFIG, overrides).rollout.max_staleness


def staleness_from_storage(trial_dir: Path, max_staleness: int) -> dict[str, Any]:
    """The staleness bound, checked from the trainer's audit trail alone (``trainer/consumed/step-*.json``).

    Step ``s`` trains at policy version ``s - 1``; a group made under head version ``h`` is ``s - 1 - h``
    versions stale, and the bound holds when that is ``<= max_staleness`` for every group of every step.
    A step trained again after a resume rewrites its file; the surviving record is the one judged.
    """
    worst = -1
    for f in sorted((trial_dir / "trainer" / "consumed").glob("step-*.json")):
        rec = json.loads(f.read_text())
        worst = max(worst, max((rec["step"] - 1 - h for h in rec["head_versions"]), default=-1))
    return {
        "staleness_max": worst,
        "staleness_bound": max_staleness,
        "staleness_held": worst <= max_staleness,
    }


def _check_time(deadline: float, workdir: Path, what: str) -> None:
    if time.monotonic() > deadline:
        tail = (workdir / "worker.log").read_text(errors="replace")[-4000:]
        raise TimeoutError(f"timed out waiting for {what}; worker log tail:\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    from infra.servers import free_port

    workdir = Path(tempfile.mkdtemp(prefix="auto-resume-"))
    port = free_port()
    env = dict(
        os.environ,
        PREFECT_HOME=str(workdir / "prefect"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        PREFECT_WORKER_QUERY_SECONDS="1",
        ROLLFLOW_PROJECT_DIR=str(ROOT),
    )
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=open(workdir / "server.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_http(env["PREFECT_API_URL"] + "/health", server, timeout=120, what="prefect server")
        figures, audit = run_auto_resume(env, workdir, kills=args.kills, steps=args.steps)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    for k, v in figures.items():
        print(k, v)
    for p in audit.problems:
        print("problem", p)
    ok = audit.ok and figures["final_state"] == "Completed" and figures["auto_resumes"] == args.kills
    ok = ok and figures["staleness_held"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
