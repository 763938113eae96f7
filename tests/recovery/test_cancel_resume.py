"""A Prefect cancel in the middle of generation keeps the episodes in flight, and a resume continues them:
a real Prefect server, a process worker and the ``async-rl/local`` deployment of ``prefect.yaml``, on the
tiny config with a random model (its samples run long) and ``rollout.keep_partials`` on (the default).

The run is cancelled (``prefect flow-run cancel``) once it has published version 1 and its CPU server has
output tokens in flight. It must end Cancelled with partial records in storage (tokens, logprobs and
per-token versions of the samples it cut); then the deployment runs again with ``resume=true`` on the
trial and finishes. Committed rows must start with exactly the tokens of a saved partial, under the
versions recorded before the cancel, and go on under the same version or a newer one
(``tests/partial_checks.py``); the storage audit (``bench.prompt_audit``) must be clean. The number of
carried tokens and the flow's ``partial_commit_s`` log line are printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from partial_checks import continued_row, cut_samples
from server_waits import running_output_tokens

from bench.auto_resume import CONFIG, DEPLOYMENT
from bench.prefect_local import deploy_local, start_worker, stop_worker
from bench.prefect_local import prefect_cli as _prefect
from bench.prompt_audit import audit_config
from infra.servers import free_port
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.shard_reader import ShardReader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TRIAL = "cancelresume"
STEPS = 80  # ~1 s a step here: the cancel (~5 s after v1) lands near v8; 20, and once 40, were too few in a full suite
MAX_NEW_TOKENS = 160  # most of a random model's samples run to it: the cancel finds them in the middle


def _run_id(out: str) -> str:
    return next(line.split()[-1] for line in out.splitlines() if "UUID" in line)


def _state(env: dict[str, str], run_id: str) -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as pc:
        state = pc.read_flow_run(run_id).state
    return state.type.value if state else None


def _wait(what: str, done: Callable[[], bool], log: Path, timeout_s: float, every_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}; worker log:\n{log.read_text()[-4000:]}")
        time.sleep(every_s)


def test_a_cancel_mid_generation_keeps_partials_that_the_resume_continues(
    prefect_server: str,
    prefect_env: dict[str, str],
    tmp_path: Path,
) -> None:
    env = dict(prefect_env)
    port = free_port()
    addr = f"127.0.0.1:{port}"
    overrides = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        "tracking.register_model=false",
        f"model.path={tmp_path / 'model'}",
        "model.tiny.warm_start_steps=0",  # random: few samples meet EOS before MAX_NEW_TOKENS
        f"inference.base_port={port}",
        "inference.n_servers=1",
        f"train.steps={STEPS}",
        "train.batch_size=4",
        "rollout.group_size=4",
        "rollout.max_concurrent_rollouts=8",
        "rollout.max_staleness=4",  # the resume keeps the partials (none beyond the bound)
        f"rollout.generation.max_new_tokens={MAX_NEW_TOKENS}",
        "eval.n_prompts=4",
        "eval.max_new_tokens=4",
        "eval.every_n_versions=0",
        f"trial={TRIAL}",
    ]
    storage = Storage.open(str(tmp_path / "storage"), "tiny-arith", TRIAL, {})
    deploy_local(env)
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    t0 = time.monotonic()
    try:
        run1 = _run_id(
            _prefect(env, "deployment", "run", DEPLOYMENT, "--param", f"overrides={json.dumps(overrides)}")
        )
        ckpts = CheckpointStore(storage)
        _wait("version 1", lambda: (ckpts.latest_version() or 0) >= 1, log, timeout_s=240)
        _wait("tokens in flight", lambda: running_output_tokens(addr) >= 16, log, timeout_s=60, every_s=0.01)
        _prefect(env, "flow-run", "cancel", run1)
        _wait(
            "the run to end",
            lambda: _state(env, run1) in ("CANCELLED", "CRASHED", "FAILED", "COMPLETED"),
            log,
            120,
            1,
        )
        assert _state(env, run1) == "CANCELLED", log.read_text()[-4000:]
        version_at_cancel = ckpts.latest_version() or 0
        assert version_at_cancel < STEPS, "the run finished before the cancel: raise STEPS"
        cut = cut_samples(storage)
        assert cut, log.read_text()[-4000:]  # the cancel kept samples cut in the middle ...
        for s in cut:  # ... with their tokens, logprobs and per-token versions
            assert 0 < len(s.output_ids) < MAX_NEW_TOKENS
            assert len(s.output_logprobs) == len(s.output_versions) == len(s.output_ids)
            assert set(s.output_versions) <= set(range(version_at_cancel + 1)), s.output_versions
        assert max(v for s in cut for v in s.output_versions) >= 1  # made after a weight update too
        t_cancel = time.monotonic() - t0

        out = _prefect(
            env, "deployment", "run", DEPLOYMENT, "--param", f"overrides={json.dumps(overrides)}",
            "--param", "resume=true", "--watch", "--watch-timeout", "300", timeout=330,
        )  # fmt: skip
        assert _state(env, _run_id(out)) == "COMPLETED", log.read_text()[-4000:]
    finally:
        stop_worker(worker)
    rows = [r for g in ShardReader(storage).take(10**6).groups for r in g.rows]
    continued = [(s, row) for s in cut if (row := continued_row(rows, s)) is not None]
    carried = sum(len(s.output_ids) for s, _ in continued)
    kept_at_cancel = next((ln for ln in log.read_text().splitlines() if "partial_commit_s" in ln), "")
    after = {v for s, row in continued for v in row.versions[len(s.input_ids) + len(s.output_ids) :]}
    print(
        f"cancelled at v{version_at_cancel} after {t_cancel:.1f} s: {len(cut)} samples cut, "
        f"{len(continued)} continued ({carried} tokens carried, continued at versions {sorted(after)}); "
        f"total {time.monotonic() - t0:.1f} s\n{kept_at_cancel.strip()}"
    )
    assert continued, [list(s.input_ids) for s in cut]  # the resumed run continued the kept tokens
    audit = audit_config(CONFIG, overrides)
    assert audit.ok and audit.groups_trained_twice == 0 and audit.positions_generated_twice == 0, (
        audit.problems
    )
    assert audit.final_version == STEPS
