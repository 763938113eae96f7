"""A requested stop of launched CPU servers (issue 21 section 5): quiet, nothing restarted, nothing left behind.

- the group's scratch directory (``rollflow-cpu-server-*`` in the system temp dir: logs and the servers'
  ``TMPDIR``) exists while the servers run and is gone after ``stop()``;
- stopping a supervised group in the middle of generation: the client's requests end as aborts with
  the output they had, without "trying another server" warnings or "unreachable" errors, and the
  supervisor restarts nothing.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any

import pytest
from server_waits import until_generating

from infra.servers import launch_local_servers
from rollflow.api.config import InferenceConfig
from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.inference.watcher import CheckpointWatcher
from storage.checkpoints import CheckpointStore
from storage.fs import Storage


def _scratch_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("rollflow-cpu-server-*"))


def test_stop_removes_the_scratch_directory(tiny_model_dir: Path) -> None:
    before = _scratch_dirs()
    group = launch_local_servers(InferenceConfig(n_servers=1, startup_timeout_s=90), tiny_model_dir)
    try:
        scratch = group.scratch_dir
        assert scratch is not None and scratch in _scratch_dirs() - before
        assert group.servers[0].log_path.parent == scratch and (scratch / "tmp").is_dir()
    finally:
        group.stop(timeout_s=10)
    assert not scratch.exists() and _scratch_dirs() <= before


def test_a_requested_stop_is_quiet(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rollflow.inference.fleet_link import FleetLink

    group = launch_local_servers(InferenceConfig(n_servers=1, startup_timeout_s=90), tiny_model_dir)
    supervisor = group.supervise(max_restarts=3, interval_s=0.1)
    store = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"))
    client = EngineClient(group.addresses, retry_backoff_s=0.1)
    watcher = CheckpointWatcher(store, group.addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.1)
    supervisor.add_listener(FleetLink(client, watcher))
    watcher.start()

    async def go() -> list[Any]:
        sp = SamplingParams(max_new_tokens=900, ignore_eos=True)
        tasks = [asyncio.create_task(client.agenerate(GenerateRequest([5, 6, 7], sp))) for _ in range(4)]
        await until_generating(group.addresses[0], 16)  # mid-generation by the server's count
        await asyncio.to_thread(group.stop, 10)  # the flow's stop-servers, while the rollout generates
        results = await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # the watcher's next health check runs against stopped servers
        return list(results)

    with caplog.at_level(logging.WARNING):
        try:
            results = asyncio.run(go())
        finally:
            watcher.stop()
            asyncio.run(client.aclose())
    assert [r.finish_reason for r in results] == ["abort"] * 4
    assert all(len(r.output_ids) < 900 for r in results)
    noisy = [r.getMessage() for r in caplog.records if r.name.startswith(("rollflow.", "infra."))]
    assert noisy == [], noisy
    assert supervisor.restarts == {group.addresses[0]: 0} and group.returncodes()[0] is not None
