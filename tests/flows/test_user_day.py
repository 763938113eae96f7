"""The documented day (docs/operations.md, "Local server, worker and deployments"), end to end against a
real Prefect server and a process worker:

- pool creation and `prefect --no-prompt deploy --all` for the local-only setup; the GPU file refuses to
  deploy without an image and, with one, asks its pools for n_servers x tp_size GPUs;
- two `prefect deployment run 'async-rl/local'`: two trials, and a registry that changes only when the
  held-out eval holds (the second run barely trains, so it must not replace the first);
- an explicit resume of the finished first trial changes nothing;
- the nightly deployment triggered by hand: named with the real date, started from the registered version;
- a cancel: the flow run and its loop task runs end Cancelled, MLflow says KILLED, no server survives;
- the registered model loads with `mlflow.transformers.load_model`; trainer lines reach the run's logs;
- the notebook's deployment branch (`run_deployment`) with an inline plot.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TAG = "ROLLFLOW_TEST_TAG=user-day"
MODEL = "tiny-arith-policy"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # one hung run must not eat the CI budget


def _prefect(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _ok(res: subprocess.CompletedProcess, extra: str = "") -> str:
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:] + extra
    return res.stdout


def _tagged_server_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"cpu_server" in cmdline and TAG.encode() in environ.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def _client(env: dict[str, str]) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        return get_client(sync_client=True)


def _flow_run(env: dict[str, str], flow_run_id: str) -> dict[str, Any]:
    with _client(env) as client:
        fr = client.read_flow_run(flow_run_id)
    return {"id": str(fr.id), "name": fr.name, "state": {"type": fr.state.type.value if fr.state else None}}


def _run_deployment(env: dict[str, str], name: str, worker_log: Path, **params: Any) -> dict[str, Any]:
    args = ["deployment", "run", name, "--watch", "--watch-timeout", "900"]
    for k, v in params.items():
        args += ["--param", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    res = _prefect(env, *args, timeout=960)
    out = _ok(res, worker_log.read_text()[-5000:])
    run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
    fr = _flow_run(env, run_id)
    assert fr["state"]["type"] == "COMPLETED", (fr["state"], worker_log.read_text()[-5000:])
    return fr


def test_the_documented_day(
    prefect_server: str, prefect_env: dict[str, str], stop_process_group: Callable[..., None], tmp_path: Path
) -> None:
    env = {k: v for k, v in prefect_env.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
    env[TAG.split("=")[0]] = TAG.split("=")[1]
    env.pop("ROLLFLOW_IMAGE", None)

    # -- deploy, exactly as documented for one machine ---------------------------------------------
    _ok(_prefect(env, "work-pool", "create", "rollflow-local", "--type", "process"))
    out = _ok(_prefect(env, "deploy", "--all")).replace("\n", " ")
    for name in ("async-rl/local", "evaluate/local", "async-rl/nightly"):
        assert name in out, out
    assert "rollout/gpu" not in out
    with _client(env) as pc:  # the nightly is opt-in: deployed with its schedule paused
        schedules = pc.read_deployment_by_name("async-rl/nightly").schedules
    assert [s.active for s in schedules] == [False], schedules

    # the GPU file, once its pools exist (docs/gpu.md): no image is an error; with one, gpu_count follows
    # the config
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    with _client(
        env
    ) as pc:  # the GPU pools, as `prefect work-pool create ... --base-job-template` makes them
        for pool, kind, template in (
            ("rollflow-gpu-docker", "docker", "infra/work_pools/docker-gpu.json"),
            ("rollflow-gpu-k8s", "kubernetes", "infra/work_pools/kubernetes-gpu.json"),
        ):
            job_template = json.loads((ROOT / template).read_text())
            try:
                pc.create_work_pool(WorkPoolCreate(name=pool, type=kind, base_job_template=job_template))
            except ObjectAlreadyExists:  # the session's Prefect server is shared: another test made it
                pc.update_work_pool(pool, WorkPoolUpdate(base_job_template=job_template))
    res = _prefect(env, "deploy", "--all", "--prefect-file", "prefect-gpu.yaml")
    assert res.returncode != 0 and "ROLLFLOW_IMAGE" in res.stdout + res.stderr, res.stdout[-2000:]
    gpu_env = {**env, "ROLLFLOW_IMAGE": "registry.example/rollflow:gpu"}
    _ok(_prefect(gpu_env, "deploy", "--all", "--prefect-file", "prefect-gpu.yaml"))
    with _client(env) as pc:
        for name, gpus in (("rollout/gpu", 4), ("train/gpu", 8)):
            jv = pc.read_deployment_by_name(name).job_variables
            assert jv["gpu_count"] == gpus and jv["image"] == "registry.example/rollflow:gpu", jv

    worker_log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "rollflow-local"],
        env=env, cwd=ROOT, stdout=open(worker_log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    from mlflow.tracking import MlflowClient

    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(mlflow_uri)
    base = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri={mlflow_uri}",
        "eval.n_prompts=64",
        "eval.every_n_versions=0",
    ]

    def mlflow_run(flow_run_id: str) -> Any:
        exp = client.get_experiment_by_name("tiny-arith")
        (run,) = client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`prefect.flow_run_id` = '{flow_run_id}'"
        )
        return run

    try:
        # -- two runs of the same deployment: two trials ---------------------------------------
        first = _run_deployment(env, "async-rl/local", worker_log, overrides=[*base, "train.steps=20"])
        run1 = mlflow_run(first["id"])
        trial1 = run1.data.tags["rollflow.trial"]
        assert first["name"] == f"async-rl-{trial1}" and trial1.startswith("demo-")
        assert run1.data.tags["rollflow.registry.reason"] == "first-version"
        assert run1.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{first['id']}")
        assert run1.data.tags["mlflow.source.git.commit"] and run1.data.tags["rollflow.data_window"]
        acc1 = run1.data.metrics["eval/accuracy"]
        # the second run trains 2 steps at a negligible learning rate: it cannot beat the first
        second = _run_deployment(
            env, "async-rl/local", worker_log, overrides=[*base, "train.steps=2", "train.lr=1e-12"]
        )
        run2 = mlflow_run(second["id"])
        trial2 = run2.data.tags["rollflow.trial"]
        assert trial2 != trial1 and second["name"] == f"async-rl-{trial2}"
        acc2 = run2.data.metrics["eval/accuracy"]
        assert acc2 < acc1, (acc1, acc2)  # 20 steps of learning against none
        assert run2.data.tags["rollflow.registry.decision"] == "skipped"
        assert run2.data.tags["rollflow.registry.reason"] == "eval-worse"
        versions = client.search_model_versions(f"name = '{MODEL}'")
        assert [v.run_id for v in versions] == [run1.info.run_id]
        assert str(client.get_model_version_by_alias(MODEL, "latest-rl").version) == "1"

        # trainer lines reach the flow run's logs without PREFECT_LOGGING_EXTRA_LOGGERS
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs: list[Any] = []
        with _client(env) as pc:
            while page := pc.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[first["id"]])), limit=200, offset=len(logs)
            ):
                logs += page
        trainer = [
            log
            for log in logs
            if log.name == "rollflow.training.trainer"
            and log.message.startswith("training finished: version")
        ]  # the trainer's INFO line (its per-step lines are DEBUG: `-v`)
        assert trainer, [(log.name, log.message) for log in logs][-20:]

        # -- an explicit resume of the finished trial changes nothing ---------------------------
        n_loss = len(client.get_metric_history(run1.info.run_id, "train/loss"))
        again = _run_deployment(env, "async-rl/local", worker_log, overrides=base, trial=trial1, resume=True)
        assert again["name"] == f"async-rl-{trial1}"
        assert len(client.search_model_versions(f"name = '{MODEL}'")) == 1
        assert len(client.get_metric_history(run1.info.run_id, "train/loss")) == n_loss

        # -- the nightly, by hand --------------------------------------------------------------
        nightly = _run_deployment(env, "async-rl/nightly", worker_log, overrides=[*base, "train.steps=2"])
        today = time.strftime("%Y%m%d", time.gmtime())
        assert nightly["name"] == f"async-rl-nightly-{today}", nightly["name"]
        run3 = mlflow_run(nightly["id"])
        assert run3.data.tags["rollflow.source_model_version"] == "1"
        before, after = (
            sorted((m.step, m.value) for m in client.get_metric_history(run3.info.run_id, "eval/accuracy"))[
                i
            ][1]
            for i in (0, -1)
        )
        held = after >= before
        assert run3.data.tags["rollflow.registry.decision"] == ("registered" if held else "skipped")
        assert len(client.search_model_versions(f"name = '{MODEL}'")) == (2 if held else 1)

        # -- the champion loads with MLflow's own loader -----------------------------------------
        import mlflow
        import mlflow.transformers

        mlflow.set_tracking_uri(mlflow_uri)
        pipe = mlflow.transformers.load_model(f"models:/{MODEL}@latest-rl")
        assert pipe.model.config.model_type == "llama" and pipe.tokenizer is not None

        # -- a cancel ----------------------------------------------------------------------------
        cancel_root = tmp_path / "cancel-storage"
        long = [*base, "train.steps=10000", f"storage.root={cancel_root}"]
        res = _ok(
            _prefect(env, "deployment", "run", "async-rl/local", "--param", f"overrides={json.dumps(long)}")
        )
        run_id = next(line.split()[-1] for line in res.splitlines() if "UUID" in line)
        deadline = time.monotonic() + 300
        while not list(cancel_root.glob("tiny-arith/*/checkpoints/LATEST")):
            assert time.monotonic() < deadline, "the long run never published a checkpoint"
            time.sleep(1)
        assert _tagged_server_pids(), "expected a running CPU inference server"
        _ok(_prefect(env, "flow-run", "cancel", run_id))
        deadline = time.monotonic() + 180
        while _flow_run(env, run_id)["state"]["type"] not in ("CANCELLED", "CRASHED", "FAILED", "COMPLETED"):
            assert time.monotonic() < deadline, "flow run did not reach Cancelled"
            time.sleep(2)
        assert _flow_run(env, run_id)["state"]["type"] == "CANCELLED"
        deadline = time.monotonic() + 60
        while _tagged_server_pids():
            assert time.monotonic() < deadline, "inference servers outlived the cancelled flow run"
            time.sleep(1)
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        with _client(env) as pc:
            tasks = pc.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        loops = {t.name.rsplit("-", 1)[0]: t.state.type.value for t in tasks if "loop" in t.name}
        # the interrupted loops end Cancelled (the eval loop, off with every_n_versions=0, had completed)
        assert loops.get("train-loop") == loops.get("rollout-loop") == "CANCELLED", loops
        assert mlflow_run(run_id).info.status == "KILLED"

        # -- from a notebook: RLRun.submit() starts a run of the same deployment, the worker runs it -----
        # (the notebook itself trains in-process through RLRun: tests/notebooks/test_quickstart.py)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.session import RLRun
        from rollflow.configuration.loader import load_config

        cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), [*base, "train.steps=2"])
        with temporary_settings({PREFECT_API_URL: prefect_server}):
            submitted = RLRun(config=cfg).submit(wait=True)
        assert submitted.state is not None and submitted.state.is_completed(), (
            submitted.state,
            worker_log.read_text()[-5000:],
        )
        assert mlflow_run(str(submitted.id)).data.params["train.steps"] == "2"
    finally:
        stop_process_group(worker)
