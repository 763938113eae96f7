"""Distributed async-rl end to end: the parent flow triggers 2 `rollout` deployment runs and 1 `train`
deployment run on a process work pool, all on one moto S3 root and one MLflow server.

Real parts: a Prefect server, a process work pool with a `prefect worker`, `prefect deploy` of the
rollout and train flows, moto's S3 server, `mlflow server`, and a CPU inference server per rollout
worker (plus the parent's own, for evaluation). The parent runs in this process.

Asserts: the run completes and the final model is registered; every group the trainer took was
committed and taken once, and taken + dropped as stale never exceeds what was committed; every trained
group was within the staleness bound; both writers' groups were trained on; MLflow holds the
trainer's metrics and the evals in the parent run and each rollout worker's metrics in a nested run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

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
"""


def _prefect(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


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
    from storage.shards import ShardReader

    monkeypatch.chdir(ROOT)
    env = dict(prefect_env)
    res = _prefect(env, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    assert res.returncode == 0, res.stdout + res.stderr
    spec = tmp_path / "prefect.yaml"
    spec.write_text(DEPLOY_YAML.format(root=ROOT, pool=POOL))
    res = _prefect(env, "deploy", "--all", "--prefect-file", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr

    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (outlives this block)
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--limit", "4"],
        env=env, cwd=ROOT, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    root = f"s3://{s3_server.bucket}/dist"  # type: ignore[attr-defined]
    options = s3_server.options  # type: ignore[attr-defined]
    overrides = [
        "experiment=dist-arith",
        "trial=dist-test",
        f"storage.root={root}",
        f"storage.options={json.dumps(options)}",
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

    def writer(gid: str) -> str:
        return committed[gid].rows[0].writer.rsplit("-", 1)[0]  # the writer id less its random suffix

    by_writer = Counter(writer(gid) for gid in committed)
    trained_by = Counter(writer(gid) for gid in taken)
    assert set(by_writer) == {"rollout-w0", "rollout-w1"}, by_writer  # both committed groups...
    assert set(trained_by) == {"rollout-w0", "rollout-w1"}, (trained_by, by_writer)  # ...that were trained

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
