"""What `make demo` prints (issue 21): a short story, not the plumbing.

Runs the command `make demo DEMO_CONFIG=configs/tiny_cpu.yaml` runs (`python -m flows.async_rl`) on the
smoke config, shortened to 30 steps, in a subprocess with a fresh storage root and MLflow store (as CI's
clean clone has), against the session's Prefect server, and checks what came out on stdout + stderr:

- at most 40 lines, counting the command line make echoes, with no WARNING and no traceback;
- one progress line per 10 % of training (steps 3, 6, ..., 30), with reward, held-out accuracy,
  completions/s and staleness;
- the summary `bench.demo_check` reads (before < after) and the `time:` line, at the end;
- none of the per-step chatter (checkpoints, weight loads, the config dump, the list of versions);
- in Prefect, one `train-progress` artifact for the run, updated in place to 100 %.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.demo_check import main as demo_check
from bench.demo_check import read_summary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 40
MAKE_ECHO = 1  # make prints the command line before the run's own output


def _artifacts_of(flow_run_name: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterName,
    )

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name]))
        )
        return list(
            client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
            )
        )


def test_the_demo_prints_a_short_story_with_progress_lines_and_the_summary(
    use_prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in prefect_env.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
    env["PYTHONUNBUFFERED"] = "1"
    steps = 30
    cmd = [
        sys.executable, "-m", "flows.async_rl", "--config", "configs/tiny_cpu.yaml",
        f"storage.root={tmp_path / 'storage'}", f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"train.steps={steps}", "eval.every_n_versions=10", "eval.n_prompts=100",
        f"trial=demo-out-{uuid.uuid4().hex[:6]}",
    ]  # fmt: skip
    # `make demo 2>&1 | tee`: both streams, in the order they were written
    res = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540
    )
    out = res.stdout
    (tmp_path / "demo.log").write_text(out)
    assert res.returncode == 0, out[-5000:]
    lines = out.splitlines()

    assert len(lines) + MAKE_ECHO <= MAX_LINES, f"{len(lines)} lines:\n{out}"
    noisy = [line for line in lines if re.search(r"\bWARNING\b|Traceback|Warning:", line)]
    assert not noisy, "\n".join(noisy)  # no WARNING and no traceback in what the demo prints

    progress = [re.search(r"progress (\d+)/(\d+) \((\d+)%\): (.*)$", line) for line in lines]
    progress = [m for m in progress if m]
    assert [int(m.group(1)) for m in progress] == list(range(3, steps + 1, 3)), out
    assert [int(m.group(3)) for m in progress] == list(range(10, 101, 10)), out
    for m in progress:
        assert re.search(r"reward \d\.\d{3}", m.group(4)) and "completions/s" in m.group(4), m.group(0)
        assert re.search(r"staleness \d+\.\d", m.group(4)), m.group(0)
    assert "held-out accuracy 0." in progress[0].group(4), progress[0].group(0)  # the "before" score, v0
    assert any(re.search(r"held-out accuracy [01]\.\d{3} \(v[1-9]\d*[;)]", m.group(4)) for m in progress), out

    summary = read_summary(out)
    assert set(summary) == {"eval_accuracy_before", "eval_accuracy_after"}, out[-3000:]
    assert demo_check([str(tmp_path / "demo.log")]) == 0, summary  # what CI runs on `make demo`'s log
    tail = "\n".join(lines[-10:])
    assert "eval_accuracy_after" in tail and re.search(r"^time: trainer ", tail, re.MULTILINE), tail

    assert re.search(
        r"training finished: version 30 after 30 step\(s\) \(fresh start\), 480 groups trained", out
    )
    assert "31 checkpoint(s) published (v0..v30)" in out  # a count and a range, not the list
    for chatter in ("published checkpoint", "serving v", "resume point committed", "resolved config",
                    "published_versions", "synthetic split", "loss="):  # fmt: skip
        assert chatter not in out, chatter
    assert out.count("Finished in state Completed()") == 1, out  # the flow run's, not every task's

    trial = re.search(r"^trial (\S+)$", out, re.MULTILINE)
    assert trial, out
    artifacts = _artifacts_of(f"async-rl-{trial.group(1)}")
    progress_artifacts = [a for a in artifacts if a.key == "train-progress"]
    assert len(progress_artifacts) == 1, [(a.key, a.data) for a in artifacts]  # updated in place
    assert float(progress_artifacts[0].data) == 100.0
    keys = [a.key for a in artifacts]
    assert len(keys) == len(set(keys)), keys  # every artifact created once per run
    assert "resolved-config" in keys, keys  # the config dump moved out of the log
