"""Distributed async-rl end to end: the parent flow triggers 2 `rollout` deployment runs and 1 `train`
deployment run on a process work pool, all on one moto S3 root and one MLflow server.

Real parts: a Prefect server, a process work pool with a `prefect worker`, `prefect deploy` of the
rollout and train flows, moto's S3 server, `mlflow server`, and a CPU inference server per rollout
worker (plus the parent's own, for evaluation). The parent runs in this process.

Asserts: the run completes and the final model is registered; every group the trainer took was
committed and taken once, and taken + dropped as stale never exceeds what was committed; every trained
group was within the staleness bound; the two writers together committed no more than the one global
bound allows, and no prompt was generated twice across them; MLflow holds the
trainer's metrics and the evals in the parent run and each rollout worker's metrics in a nested run.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # whole runs on a shared 2-core machine

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POOL = "rollflow-dist-test"
STEPS = 10
MAX_STALENESS = 2

DEPLOY_YAML = """
name: rollflow-dist-test
prefect-version: 3.8.8
build: null
push: null
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{root}"
deployments:
  - name: dist-test
    entrypoint: flows/rollout.py:rollout
    work_pool: {{name: {pool}}}
  - name: dist-test
    entrypoint: flows/train.py:train
    work_pool: {{name: {pool}}}
  - name: dist-test
    entrypoint: flows/async_rl.py:async_rl
    work_pool: {{name: {pool}}}
"""


def _prefect(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _deploy_and_start_worker(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[bytes]:
    res = _prefect(env, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    assert res.returncode == 0, res.stdout + res.stderr
    spec = tmp_path / "prefect.yaml"
    spec.write_text(DEPLOY_YAML.format(root=ROOT, pool=POOL))
    res = _prefect(env, "deploy", "--all", "--prefect-file", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (outlives this block)
    return subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--limit", "4"],
        env=env, cwd=ROOT, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _s3_credentials(s3_server: Any, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """The S3 keys go where a user's go: the environment of this process and of the worker (flow
    parameters holding credentials are refused, since Prefect stores parameters in plain text)."""
    creds = {"AWS_ACCESS_KEY_ID": s3_server.key, "AWS_SECRET_ACCESS_KEY": s3_server.secret}
    env.update(creds)
    for name, value in creds.items():
        monkeypatch.setenv(name, value)


def _overrides(trial: str, root: str, options: dict, mlflow_server: str, tmp_path: Path) -> list[str]:
    public = {k: v for k, v in options.items() if k not in ("key", "secret")}  # keys: the environment
    return [
        "experiment=dist-arith",
        f"trial={trial}",
        f"storage.root={root}",
        f"storage.options={json.dumps(public)}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"model.path={tmp_path / 'model'}",
        "model.tiny.warm_start_steps=20",
        f"tracking.mlflow_tracking_uri={mlflow_server}",
        f"train.steps={STEPS}",
        "train.batch_size=8",
        "train.data_wait_timeout_s=300",
        f"rollout.max_staleness={MAX_STALENESS}",
        "eval.every_n_versions=3",
        "eval.n_prompts=16",
        "orchestration.mode=distributed",
        "orchestration.n_rollout_workers=2",
        "orchestration.rollout_deployment=rollout/dist-test",
        "orchestration.train_deployment=train/dist-test",
        "orchestration.deployment_timeout_s=1200",
    ]


@dataclasses.dataclass
class _Fleet:
    env: dict[str, str]  # the worker's environment (the S3 keys included)
    worker: subprocess.Popen[bytes]
    root: str
    options: dict[str, Any]  # the full S3 options, for the test's own reads
    overrides: list[str]  # what the parent flow gets (no keys)


def _start_fleet(
    trial: str, s3_server: Any, prefect_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
    mlflow_server: str, tmp_path: Path,
) -> _Fleet:  # fmt: skip
    """The deployments and a process worker, the S3 keys in the environments, the trial's overrides."""
    env = dict(prefect_env)
    _s3_credentials(s3_server, monkeypatch, env)
    worker = _deploy_and_start_worker(env, tmp_path)
    root = f"s3://{s3_server.bucket}/{trial}"
    overrides = _overrides(trial, root, s3_server.options, mlflow_server, tmp_path)
    return _Fleet(env, worker, root, s3_server.options, overrides)


def test_two_rollout_workers_and_a_trainer_as_deployment_runs(
    use_prefect_server: str,
    prefect_env: dict[str, str],
    s3_server: object,
    mlflow_server: str,
    stop_process_group: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flows.async_rl import async_rl
    from storage.fs import Storage
    from storage.shard_reader import ShardReader

    monkeypatch.chdir(ROOT)
    fleet = _start_fleet("dist-test", s3_server, prefect_env, monkeypatch, mlflow_server, tmp_path)
    worker, root, options, overrides = fleet.worker, fleet.root, fleet.options, fleet.overrides
    try:
        summary = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides)
    except BaseException:
        print((tmp_path / "worker.log").read_text()[-20000:])
        raise
    finally:
        stop_process_group(worker)

    assert summary["final_version"] == STEPS
    assert summary["registered_model"] == "dist-arith-policy v1", summary
    assert summary["rollout"]["completed"] == 2, summary

    # --- storage: exactly once, within the bound, both writers ---
    storage = Storage.open(root, "dist-arith", "dist-test", options)
    committed = {g.group_id: g for g in ShardReader(storage).take(100_000).groups}
    steps = [storage.get_json(f"trainer/consumed/step-{s:08d}.json") for s in range(1, STEPS + 1)]
    taken = [gid for st in steps for gid in st["groups"]]
    assert len(taken) == STEPS * 8 and len(set(taken)) == len(taken)  # each group trained once
    assert set(taken) <= set(committed)
    done = storage.get_json("trainer/DONE.json")
    assert done["groups_consumed"] == len(taken)
    assert len(taken) + done["dropped_stale"] <= len(committed)
    for st in steps:  # step s trained at version s - 1 on groups no older than the bound
        assert min(st["head_versions"]) >= st["step"] - 1 - MAX_STALENESS, st
    # One bound for both writers: live groups <= (max_staleness + v + 1) * B + credited drops, and v
    # ends at STEPS (two writers each counting only their own groups would allow twice this).
    assert len(committed) <= (MAX_STALENESS + STEPS + 1) * 8 + done["dropped_stale"], len(committed)

    def writer(gid: str) -> str:
        return committed[gid].rows[0].writer.rsplit("-", 1)[0]  # the writer id less its random suffix

    by_writer = Counter(writer(gid) for gid in committed)
    trained_by = Counter(writer(gid) for gid in taken)
    # Which writers committed, and whose groups the trainer took, depend on when each worker's flow run
    # started (elastic workers: one that starts late finds the global bound already spent by the other;
    # runs here had w0 commit 16 of 104, and w1 none). Both workers ran to the end (asserted above), only
    # they committed, and they split the prompts: the run stays inside one epoch of the 2000 training
    # prompts, so no prompt may have been generated twice, by one worker or by both.
    assert by_writer and set(by_writer) <= {"rollout-w0", "rollout-w1"}, by_writer
    prompts = Counter(g.prompt_id for g in committed.values())
    assert max(prompts.values()) == 1, [p for p, n in prompts.items() if n > 1]
    assert set(trained_by) <= {"rollout-w0", "rollout-w1"}, trained_by

    # --- MLflow: trainer + evals in the parent run, each rollout worker in a nested run ---
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    for name in ("train/loss", "train/reward_mean", "eval/accuracy"):
        assert client.get_metric_history(run.info.run_id, name), f"{name} missing in the parent run"
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == STEPS
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"
    )
    assert sorted(c.data.tags["rollflow.role"] for c in children) == ["rollout-0", "rollout-1"]
    for c in children:
        assert c.info.status == "FINISHED"
        assert any(k.startswith("rollout/") for k in c.data.metrics), c.data.metrics


def _flow_run_pid(flow_run_id: str) -> int | None:
    """The pid of the process a process worker runs ``flow_run_id`` in (found by its environment)."""
    needle = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    return None


def test_kill_9_one_rollout_worker_and_the_run_completes(
    use_prefect_server: str,
    prefect_env: dict[str, str],
    s3_server: object,
    mlflow_server: str,
    stop_process_group: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the trainer published v2 and a rollout worker has committed a shard, its flow-run process
    gets SIGKILL. The worker reports the run Crashed, the parent logs it and goes on, the other worker and
    the trainer finish, and nothing the killed worker committed is trained twice."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.async_rl import async_rl
    from storage import keys
    from storage.fs import Storage
    from storage.shard_reader import ShardReader

    monkeypatch.chdir(ROOT)
    fleet = _start_fleet("dist-fault", s3_server, prefect_env, monkeypatch, mlflow_server, tmp_path)
    worker, root, options, overrides = fleet.worker, fleet.root, fleet.options, fleet.overrides
    overrides.append("experiment=dist-fault")  # its own registered model name
    storage = Storage.open(root, "dist-fault", "dist-fault", options)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides)
        except BaseException as e:  # reported below
            result["error"] = e

    ctx = contextvars.copy_context()  # use_prefect_server's settings live in a context var
    t = threading.Thread(target=ctx.run, args=(run,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 900
        victim = None
        while victim is None:
            assert t.is_alive(), f"the run ended before the kill: {result}"
            assert time.monotonic() < deadline, "no worker had committed while v2 was out"
            time.sleep(1.0)
            latest = storage.get_json(keys.LATEST_KEY) if storage.exists(keys.LATEST_KEY) else {}
            if latest.get("version", -1) < 2:
                continue
            # Which worker commits first depends on when each flow run started (one that starts late can
            # find the global bound spent), so the victim is a worker that has committed, w1 if it has.
            commits = storage.list("trajectories/commits")
            writers = [w for w in ("w1", "w0") if any(f"/rollout-{w}-" in k for k in commits)]
            if not writers:
                continue
            with get_client(sync_client=True) as client:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        name=FlowRunFilterName(any_=[f"rollout-dist-fault-{writers[0]}"])
                    )
                )
            victim = _flow_run_pid(str(runs[0].id)) if runs else None
        os.kill(victim, signal.SIGKILL)
        t.join(1200)
        assert not t.is_alive(), "the run did not finish after a rollout worker was killed"
    finally:
        stop_process_group(worker)
    if "error" in result:
        print((tmp_path / "worker.log").read_text()[-20000:])
    assert "error" not in result, repr(result.get("error"))
    summary = result["summary"]
    assert summary["final_version"] == STEPS
    assert summary["rollout"]["completed"] == 1, summary  # the killed one ended Crashed
    committed = {g.group_id for g in ShardReader(storage).take(100_000).groups}
    taken = [
        gid
        for s in range(1, STEPS + 1)
        for gid in storage.get_json(f"trainer/consumed/step-{s:08d}.json")["groups"]
    ]
    assert len(set(taken)) == len(taken) == STEPS * 8 and set(taken) <= committed


def test_cancelling_the_parent_cancels_the_children(
    prefect_server: str,
    prefect_env: dict[str, str],
    s3_server: object,
    mlflow_server: str,
    stop_process_group: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`prefect deployment run 'async-rl/dist-test'`, then `prefect flow-run cancel` of it once its three
    children run: every child ends Cancelled and no child flow-run process or inference server is left."""
    fleet = _start_fleet("dist-cancel", s3_server, prefect_env, monkeypatch, mlflow_server, tmp_path)
    env, worker, overrides = fleet.env, fleet.worker, [*fleet.overrides, "train.steps=100000"]
    try:
        res = _prefect(
            env, "deployment", "run", "async-rl/dist-test", "--param", f"overrides={json.dumps(overrides)}"
        )
        assert res.returncode == 0, res.stdout + res.stderr
        parent = next(line.split()[-1] for line in res.stdout.splitlines() if "UUID" in line)
        names = ["train-dist-cancel", "rollout-dist-cancel-w0", "rollout-dist-cancel-w1"]
        deadline = time.monotonic() + 900
        while True:
            children = {r["name"]: r for r in _flow_runs(env, names)}
            if len(children) == 3 and all(r["state"]["type"] == "RUNNING" for r in children.values()):
                break
            assert time.monotonic() < deadline, f"children never all ran: {children}"
            time.sleep(2)
        pids = [_flow_run_pid(r["id"]) for r in children.values()]
        assert all(pids), pids
        res = _prefect(env, "flow-run", "cancel", parent)
        assert res.returncode == 0, res.stdout + res.stderr
        deadline = time.monotonic() + 300
        while True:
            states = {r["name"]: r["state"]["type"] for r in _flow_runs(env, names)}
            if all(st == "CANCELLED" for st in states.values()):
                break
            assert time.monotonic() < deadline, f"children not cancelled: {states}"
            time.sleep(2)
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            assert time.monotonic() < deadline, "a child flow-run process outlived the cancellation"
            time.sleep(1)
    finally:
        stop_process_group(worker)


def _flow_runs(env: dict[str, str], names: list[str]) -> list[dict[str, Any]]:
    """Flow runs by name, through the API (id, name, state)."""
    import urllib.request

    body = json.dumps({"flow_runs": {"name": {"any_": names}}}).encode()
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + "/flow_runs/filter", data=body, headers={"Content-Type": "application/json"}
    )
    for attempt in range(5):  # a Prefect server on 2 busy cores can stall for a while during a cancel
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except TimeoutError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
