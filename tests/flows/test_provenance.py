"""Provenance that stays valid (issue 21 §3): flow-run links only to a server that outlives the run, and
the trial's name on the run from its first log line.

- Through the private Prefect API of a command-line run (``flows.local_api``: no UI, gone with the
  process) nothing links to it: no "View at" line, no ``prefect.flow_run_url`` lineage tag; the flow run
  id is still recorded.
- Against the user's server (``PREFECT_API_URL``) both name that server's UI.
- An ``async-rl`` run with no trial named is ``async-rl-<its fresh trial>`` from "Beginning flow run ...",
  and that is the trial it works on (before, it was a random name until a rename mid-run).
- An ``evaluate`` run is ``evaluate-<trial>-v<N>`` from "Beginning flow run ..." too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
import flows  # makes $PREFECT_HOME before prefect is imported
from prefect import flow
from flows.local_api import local_prefect_api
from tasks.runtime import flow_run_lineage

@flow(name="provenance-probe")
def probe() -> dict:
    return flow_run_lineage()

with local_prefect_api() as url:
    assert url is not None
    print("LINEAGE", json.dumps(probe()))
"""


@pytest.mark.timeout(400)
def test_a_private_prefect_api_is_never_linked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true"
    )
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=380
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("LINEAGE ")]
    lineage = json.loads(line.removeprefix("LINEAGE "))
    assert re.fullmatch(r"[0-9a-f-]{36}", lineage["prefect.flow_run_id"]), lineage
    assert "prefect.flow_run_url" not in lineage, lineage
    assert "Beginning flow run" in text  # the run's own lines are there ...
    assert "View at" not in text and "127.0.0.1" not in text  # ... but no link to the dying API


def test_the_users_prefect_server_is_linked(use_prefect_server: str) -> None:
    from prefect import flow

    from tasks.runtime import flow_run_lineage

    @flow(name="provenance-probe")
    def probe() -> dict[str, str]:
        return flow_run_lineage()

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    run_logger = logging.getLogger("prefect.flow_runs")
    run_logger.addHandler(handler)
    try:
        lineage = probe()
    finally:
        run_logger.removeHandler(handler)
    ui = use_prefect_server.removesuffix("/api")
    assert lineage["prefect.flow_run_url"] == f"{ui}/runs/flow-run/{lineage['prefect.flow_run_id']}"
    assert f"View at {lineage['prefect.flow_run_url']}" in lines  # the log's link is the same


def test_an_async_rl_run_carries_its_trial_name_from_its_first_line(
    use_prefect_server: str, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    from flows.async_rl import async_rl

    overrides = [
        f"storage.root={tmp_path / 'storage'}",
        "tracking.enabled=false",
        "model.bootstrap_tiny=false",
        "model.path=no-such-model",  # fails right after the trial is chosen: no model to serve
    ]
    state = async_rl(config=str(ROOT / "configs/tiny_cpu.yaml"), overrides=overrides, return_state=True)
    assert state.is_failed(), state
    APILogHandler().flush()  # the run's queued log lines, into the server
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), sort=LogSort.TIMESTAMP_ASC
        )
    m = re.fullmatch(r"async-rl-(demo-\d{8}-\d{6}-[0-9a-f]{4})", run.name)
    assert m, run.name  # the config's trial "demo", made fresh
    trial = m.group(1)
    messages = [log.message for log in logs]
    assert messages[0] == f"Beginning flow run '{run.name}' for flow 'async-rl'", messages[:3]
    assert f"trial {trial} (new)" in messages, messages  # the trial it worked on is the one in its name
    assert not [m for m in messages if "Renamed flow run" in m]


@pytest.mark.parametrize(("version", "name"), [(4, "evaluate-ev-v4"), (-1, "evaluate-ev")])
def test_an_evaluate_run_carries_its_trial_and_version_from_its_first_line(
    use_prefect_server: str, tmp_path: Path, version: int, name: str
) -> None:
    """Named ``evaluate-<trial>-v<N>`` as it starts (it used to start as a random name such as
    'smart-sloth' and be renamed later); ``evaluate-<trial>`` when it is to score the latest and none is
    published. Both runs fail right after: no checkpoint v4, no checkpoint at all."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    from flows.evaluate import evaluate

    overrides = [f"storage.root={tmp_path / 'storage'}", "trial=ev", "tracking.enabled=false"]
    state = evaluate(
        config=str(ROOT / "configs/tiny_cpu.yaml"), overrides=overrides, version=version, return_state=True
    )
    assert state.is_failed(), state
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), sort=LogSort.TIMESTAMP_ASC
        )
    assert run.name == name
    messages = [log.message for log in logs]
    assert messages[0] == f"Beginning flow run '{name}' for flow 'evaluate'", messages[:3]


def test_the_name_follows_the_trial_parameters() -> None:
    from flows.run_name import _trial_of

    config = str(ROOT / "configs/tiny_cpu.yaml")
    today = time.strftime("%Y%m%d", time.gmtime())
    assert _trial_of({"config": config, "trial": "nightly-{date}"}) == (f"nightly-{today}", False)
    assert _trial_of({"config": config, "overrides": ["trial=exp-{date}"]}) == (f"exp-{today}", False)
    assert _trial_of({"auto_resume_of": "async-rl-demo-1"}) == ("demo-1", False)  # the run it resumes
    fresh, is_fresh = _trial_of({"config": config})
    assert is_fresh and re.fullmatch(r"demo-\d{8}-\d{6}-[0-9a-f]{4}", fresh), fresh
    with pytest.raises(ValueError, match="resume without a trial"):  # the flow says what to pass
        _trial_of({"config": config, "resume": True})
