"""Many rollout workers on one trial (local dir and moto S3): one global staleness bound, each prompt
claimed once per epoch, a new worker cannot run ahead, a dead worker's prompts are adopted, and a
restarted worker counts only its own commits. Workers are real loops on real storage, each in its own
thread and event loop; the inference client is a 10-line fake whose version the test moves.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_loop import OneRowWorkflow, _arith_rows, _cfg, _rows, _tiny_rlvr

from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.rollout.loop import run_rollout_loop
from storage.fs import Storage
from storage.group_ledger import GroupLedger
from storage.keys import CLAIM_DIR
from storage.shard_reader import ShardReader


class GatedClient:
    """Generates one token at ``version`` once ``go`` is set; never returns if ``hang``."""

    def __init__(self, go: threading.Event, *, hang: bool = False) -> None:
        self.version, self.go, self.hang = 0, go, hang

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        while self.hang or not self.go.is_set():
            await asyncio.sleep(0.01)
        return GenerateResult(req.rid or "r", req.input_ids, [5], [-0.1], [self.version], "stop")

    def get_version(self) -> int:
        return self.version


class Worker(threading.Thread):
    def __init__(self, storage: Storage, name: str, client: GatedClient, **rollout: Any) -> None:
        super().__init__(daemon=True)
        self.storage, self.name_, self.client = storage, name, client
        self.cfg = _cfg(
            **{"max_concurrent_rollouts": 2, "max_staleness": 1, "claim_block_size": 1, **rollout}
        )
        self.stop = threading.Event()
        self.summary: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.summary = asyncio.run(
                run_rollout_loop(
                    self.cfg, self.storage, self.client, prompts=_rows(20), workflow=OneRowWorkflow(),
                    stop_event=self.stop, writer_name=self.name_, poll_interval_s=0.02, done_poll_s=0.1,
                )
            )  # fmt: skip
        except BaseException as e:
            self.error = e

    def finish(self) -> Any:
        self.stop.set()
        self.join(60)
        assert self.error is None, self.error
        return self.summary


def _until(cond: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _claimants(storage: Storage) -> set[str]:
    return {storage.get_json(k)["name"] for k in storage.list(CLAIM_DIR)}


def _committed(storage: Storage) -> int:
    return GroupLedger(storage).refresh().accepted


def test_two_workers_share_one_bound_and_a_new_worker_cannot_run_ahead(storage_spec) -> None:
    """B = 4, max_staleness = 1, blocks of 1 prompt, 2 episodes per worker at a time.

    version 0: (1 + 0 + 1) * 4 = 8 groups may exist in the trial, whoever makes them: A and B together
    stop at 8 (uncoordinated, each would make 8). version 1: (1 + 1 + 1) * 4 = 12: 4 more. A third
    worker that joins then finds the bound reached and makes none.
    """
    go = threading.Event()
    a = Worker(storage_spec.open(), "a", GatedClient(go))
    b = Worker(storage_spec.open(), "b", GatedClient(go))
    storage = storage_spec.open()
    workers = [a, b]
    for w in workers:
        w.start()
    try:
        assert _until(lambda: _claimants(storage) == {"a", "b"})  # both hold prompts before any finishes
        go.set()
        assert _until(lambda: _committed(storage) == 8)
        time.sleep(0.5)  # many capacity checks and syncs later: still 8
        assert _committed(storage) == 8 and len(storage.list(CLAIM_DIR)) == 8
        a.client.version = b.client.version = 1
        assert _until(lambda: _committed(storage) == 12)
        c = Worker(storage_spec.open(), "c", GatedClient(go))
        c.client.version = 1
        workers.append(c)
        c.start()
        time.sleep(0.8)
        assert _committed(storage) == 12
    finally:
        summaries = {w.name_: w.finish() for w in workers}
    assert summaries["c"].accepted == 0
    view = GroupLedger(storage).refresh()
    assert view.accepted == 12 and summaries["a"].accepted + summaries["b"].accepted == 12
    assert summaries["a"].accepted > 0 and summaries["b"].accepted > 0  # both contributed
    # nothing twice, nothing lost: a trainer takes exactly the 12 groups, 12 distinct prompts of epoch 0
    groups = ShardReader(storage).take(100).groups
    assert len(groups) == 12 and len({g.group_id for g in groups}) == 12
    assert len({g.prompt_id for g in groups}) == 12

    # a restarted worker counts its own commits (all its lives), not the others'
    again = Worker(storage_spec.open(), "a", GatedClient(go))
    again.client.version = 1
    again.start()
    time.sleep(0.5)
    assert again.finish().total_accepted == summaries["a"].accepted


def test_a_dead_workers_prompts_are_adopted_once_after_its_lease(storage_spec) -> None:
    """Worker A claims prompts 0..3 (the whole bound at version 0: (0 + 0 + 1) * 4) and hangs; it is
    stopped and its state file goes silent. B cannot claim past the bound, so it waits; after the
    lease (0.5 s) it adopts A's blocks and runs exactly those 4 prompts."""
    go = threading.Event()
    go.set()
    a = Worker(
        storage_spec.open(), "a", GatedClient(go, hang=True), max_staleness=0, max_concurrent_rollouts=4
    )
    storage = storage_spec.open()
    a.start()
    try:
        assert _until(lambda: len(storage.list(CLAIM_DIR)) == 4)
        time.sleep(0.2)
    finally:
        dead = a.finish()
    assert dead.accepted == 0
    b = Worker(
        storage_spec.open(),
        "b",
        GatedClient(go),
        max_staleness=0,
        max_concurrent_rollouts=4,
        worker_lease_s=0.5,
    )
    b.start()
    try:
        assert _until(lambda: _committed(storage) == 4)
        time.sleep(0.3)
    finally:
        alive = b.finish()
    assert alive.accepted == 4 and len(storage.list(CLAIM_DIR)) == 4  # adopted, not claimed anew
    groups = ShardReader(storage).take(100).groups
    assert sorted(collections.Counter(g.prompt_id for g in groups).values()) == [1, 1, 1, 1]


@pytest.mark.slow
def test_an_abort_across_a_weight_update_records_both_versions_with_two_writers(
    inference_lib: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    """Two workers generate long completions on one real CPU server; version 1 is published while both
    have episodes in flight (and further versions, alternating the weights, until an update has caught
    both mid-episode). The watcher pauses the server with abort, the clients resume the partial outputs
    on the new weights, and each writer commits rows whose tokens come from two versions: versions
    [v, ..., v, w, ..., w] (v < w) over the loss tokens, head v, tail w, and every token's logprob is the
    one its own version's weights give (teacher-forced on the full prefix)."""
    from rollflow.inference.client import EngineClient
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore

    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})
    store = CheckpointStore(storage)
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as servers:
        clients = [EngineClient(servers.addresses) for _ in range(2)]
        watcher = CheckpointWatcher(
            store, servers.addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.1,
            on_update=lambda v: [c.set_version(v) for c in clients],
        )  # fmt: skip
        models = {v: (tiny_model_dir_b if v % 2 else tiny_model_dir) for v in range(7)}  # v0 is a
        running = {"a": 0, "b": 0}
        stops = {n: threading.Event() for n in running}
        out: dict[str, Any] = {}

        def run(name: str, client: Any) -> None:
            cfg = _cfg(max_staleness=100, max_concurrent_rollouts=2, group_size=2, claim_block_size=1)

            def track(event: str, stat: Any, version: int) -> None:
                running[name] = stat.running

            try:
                out[name] = asyncio.run(
                    run_rollout_loop(
                        cfg, storage, client, version_fn=client.get_version, stop_event=stops[name],
                        workflow=_long_rlvr(tiny_model_dir), prompts=_arith_rows(40), listeners=[track],
                        writer_name=name, poll_interval_s=0.05, done_poll_s=0.2,
                    )
                )  # fmt: skip
            except BaseException as e:
                out[name] = e

        threads = [
            threading.Thread(target=run, args=(n, c), daemon=True)
            for n, c in zip(running, clients, strict=True)
        ]
        watcher.start()
        for t in threads:
            t.start()
        try:
            assert _until(lambda: all(r > 0 for r in running.values()))
            time.sleep(0.3)  # both are generating
            # An update hits whatever each worker has in flight at that moment; now and then one finds a
            # worker between episodes (about 1 run in 5 on 2 cores), so publish again, alternating the
            # weights, until both writers have committed a row across an update.
            version = 0
            while _mixed_writers(storage) < {"a", "b"} and version < 6:
                version += 1
                store.publish(models[version], version)
                assert _until(lambda v=version: all(c.get_version() == v for c in clients))
                _until(lambda: _mixed_writers(storage) >= {"a", "b"}, timeout=20)
            assert _mixed_writers(storage) >= {"a", "b"}, _versions_by_writer(storage)
        finally:
            for s in stops.values():
                s.set()
            for t in threads:
                t.join(60)
            watcher.stop()
            for c in clients:
                asyncio.run(c.aclose())
    assert all(not isinstance(v, BaseException) for v in out.values()), out
    groups = ShardReader(storage).take(1000).groups
    assert len({g.group_id for g in groups}) == len(groups)  # nothing twice
    mixed = [r for g in groups for r in g.rows if len(_loss_versions(r)) > 1]
    assert {r.writer.rsplit("-", 1)[0] for r in mixed} == {"a", "b"}
    for r in mixed:
        start = r.loss_mask.index(1)
        gen = r.versions[start:]
        assert gen == sorted(gen) and (r.head_version, r.tail_version) == (gen[0], gen[-1])  # old, then new
        ref = {v: inference_lib.teacher_forced_logprobs(models[v], r.input_ids, start) for v in set(gen)}
        got = r.logprobs[start:]
        assert max(abs(got[t] - ref[v][t]) for t, v in enumerate(gen)) < 1e-3


def _loss_versions(row: Any) -> set[int]:
    return {v for v, m in zip(row.versions, row.loss_mask, strict=True) if m}


def _mixed_writers(storage: Storage) -> set[str]:
    """Worker names that committed a row with tokens from two versions (a fresh reader every call)."""
    names = set()
    for g in ShardReader(storage).take(1000).groups:
        for r in g.rows:
            if len(_loss_versions(r)) > 1:
                names.add(r.writer.rsplit("-", 1)[0])
    return names


def _versions_by_writer(storage: Storage) -> dict[str, list[tuple[int, ...]]]:
    """Each worker's committed rows, as the sorted set of versions over their loss tokens (a diagnosis)."""
    out: dict[str, list[tuple[int, ...]]] = {}
    for g in ShardReader(storage).take(1000).groups:
        for r in g.rows:
            out.setdefault(r.writer.rsplit("-", 1)[0], []).append(tuple(sorted(_loss_versions(r))))
    return out


def _long_rlvr(model_dir: Path) -> Any:
    """The test_loop workflow, generating 300 tokens per sample regardless of EOS (long enough to be
    interrupted by a weight update)."""
    from rollflow.api.inference import SamplingParams

    wf = _tiny_rlvr(model_dir, group_size=2, max_new_tokens=300)
    wf.sampling = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)
    return wf
