"""Trajectory-store benchmark: SQL over a ~600-step trial, and the viewer's first page in headless Chromium.

Run:  .venv/bin/python -m bench.query                  (about a minute on 2 cores: most of it is writing)
      .venv/bin/python -m bench.query --steps 50       (a smaller trial, smoke run)
      .venv/bin/python -m bench.query --viewer         (+ the viewer's first page in headless Chromium)

It writes a synthetic trial with the real `ShardWriter` (the rollout's shard size: 64 rows, i.e. 8 groups
of 8 per shard), `--steps` training steps of 16 groups each (600 steps: 9,600 groups, 76,800 rows, 1,200
shards), prompts of 20-40 tokens, completions of 1-8 tokens, head versions 0-2 behind the step, and one
consumed log per step (`trainer/consumed/step-*.json`, as the trainer writes it; and, every 10 steps, a
resume point's key with a stand-in body, which is all a query looks at). Then it times, over
`--reps` repetitions (median, min..max):

- query_per_version_s: `TrajectoryQuery(storage).sql("SELECT * FROM per_version")` on a new object,
  i.e. everything a `rollflow query` call does after start-up: list and read every commit record,
  list the consumed logs, open DuckDB, read the shards and the logs, aggregate;
- query_per_version_warm_s: the same query again on the same object (the records are cached; the
  listing, the shards and the logs are read again, as while a run trains);
- query_cache_build_s: the first query with a local cache (``storage.query_cache``, what ``rollflow
  query`` uses): it reads every shard once and folds the rows into one local part;
- query_per_version_cached_s: the same query on a new object with that cache (a later ``rollflow query``
  call): listing, records, the part file;
- query_groups_filter_s: `SELECT count(*) FROM groups WHERE reward_var > 0 AND staleness >= 1` (warm);
- `*_cpu`: the same calls' CPU seconds in this process, all threads (DuckDB runs one per core): on a
  machine shared with other jobs the wall time is the CPU time stretched by the load;
- viewer_first_page_s (`--viewer`): `chromium --headless --dump-dom` of the viewer's first page served
  by `rollflow.viewer.server` on 127.0.0.1 (a new query object over the trial's local cache, as
  `rollflow view` starts), from the browser's start to the DOM printed; the browser's own start-up on
  a blank page (viewer_blank_page_s) is printed beside it.

Prints one `key value` line per figure. Targets: query_per_version_s <= 1, viewer_first_page_s <= 2.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from storage import keys
from storage.fs import Storage
from storage.query import TrajectoryQuery
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter


def synthesise_trial(
    storage: Storage, *, steps: int, groups_per_step: int = 16, group_size: int = 8, seed: int = 0
) -> int:
    """Write `steps * groups_per_step` groups through the real ShardWriter and one consumed log per step;
    returns the number of groups."""
    rng = random.Random(seed)
    n = 0
    with ShardWriter(storage, "bench", flush_rows=64, flush_seconds=3600.0) as writer:
        for step in range(1, steps + 1):
            trained_at = step - 1  # the version the update starts from
            ids = []
            heads = []
            for _ in range(groups_per_step):
                head = max(0, trained_at - rng.randrange(3))
                gid = f"g{n:06d}"
                prompt_id = f"p{rng.randrange(max(1, steps * groups_per_step // 8)):05d}"
                plen = rng.randrange(20, 41)
                prompt = [rng.randrange(3, 37) for _ in range(plen)]
                p_ok = min(0.95, 0.2 + 0.6 * step / steps)
                rows = []
                for r in range(group_size):
                    clen = rng.randrange(1, 9)
                    rows.append(
                        TrajectoryRow.build(
                            traj_id=f"{gid}-{r}",
                            group_id=gid,
                            prompt_id=prompt_id,
                            input_ids=prompt + [rng.randrange(3, 37) for _ in range(clen)],
                            loss_mask=[0] * plen + [1] * clen,
                            logprobs=[0.0] * plen + [-rng.random() * 2 for _ in range(clen)],
                            versions=[-1] * plen + [head] * clen,
                            reward=1.0 if rng.random() < p_ok else 0.0,
                            finish_reason="length" if clen == 8 else "stop",
                            created_at=1.0e9 + step + r * 1e-3,
                            writer=writer.writer_id,
                        )
                    )
                writer.add(TrajectoryGroup(gid, prompt_id, rows))
                ids.append(gid)
                heads.append(head)
                n += 1
            storage.put_json(
                keys.consumed_key(step),
                {"step": step, "groups": ids, "head_versions": heads, "dropped_stale": 0},
            )
            if step % 10 == 0:  # the trainer's resume points (train.resume_every 10); their key is what the
                # query's cache reads (logs up to the newest one are final); the body here is a stand-in
                storage.put_json(keys.trainer_state_key(step), {"step": step, "version": step})
    return n


def _timed(fn: object, reps: int) -> tuple[list[float], list[float]]:
    """Wall seconds and this process's CPU seconds (every thread: DuckDB's too) of each call."""
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()  # type: ignore[operator]
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def _line(name: str, xs: list[float] | tuple[list[float], list[float]]) -> None:
    if isinstance(xs, tuple):
        _line(name + "_cpu", xs[1])
        xs = xs[0]
    print(f"{name} {statistics.median(xs):.3f}")
    print(f"{name}_range {min(xs):.3f}..{max(xs):.3f}")


def _time_first_page(storage: Storage, reps: int, cache: Path) -> tuple[list[float], list[float]]:
    """Headless Chromium: a blank page, and the viewer's first page served by a fresh query object
    with the trial's local cache, as ``rollflow view`` serves it (alternating)."""
    from rollflow.viewer.browser import render
    from rollflow.viewer.pages import Pages
    from rollflow.viewer.server import ViewerServer

    server = ViewerServer(Pages(TrajectoryQuery(storage, cache_dir=cache), None, title="bench"))
    server.start()
    blank, page = [], []
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            render("about:blank")
            blank.append(time.perf_counter() - t0)
            server.pages.query = TrajectoryQuery(storage, cache_dir=cache)  # nothing in memory
            t0 = time.perf_counter()
            dom = render(server.url)
            page.append(time.perf_counter() - t0)
            assert "The run at a glance" in dom, dom[:500]
    finally:
        server.shutdown()
        server.server_close()
    return blank, page


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.query", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--root", default=None, help="keep the synthetic trial here (default: a temp dir)")
    p.add_argument("--viewer", action="store_true", help="also time the viewer's first page in Chromium")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or tmp
        storage = Storage.open(root, "bench", f"query-{args.steps}")
        if not storage.list(keys.COMMIT_DIR):
            t0 = time.perf_counter()
            n = synthesise_trial(storage, steps=args.steps)
            print(f"write_trial_s {time.perf_counter() - t0:.1f}")
        q = TrajectoryQuery(storage)
        records = q.committed()
        print(f"trial_groups {sum(r.groups for r in records)}")
        print(f"trial_rows {sum(r.rows for r in records)}")
        print(f"trial_shards {len(records)}")
        print(f"trial_shard_bytes {sum(r.size for r in records)}")
        n = q.sql("SELECT count(*) AS n FROM per_version").column("n")[0].as_py()
        print(f"per_version_rows {n}")
        _line(
            "query_per_version_s",
            _timed(lambda: TrajectoryQuery(storage).sql("SELECT * FROM per_version"), args.reps),
        )
        _line("query_per_version_warm_s", _timed(lambda: q.sql("SELECT * FROM per_version"), args.reps))
        cache = Path(root) / "query-cache"
        shutil.rmtree(cache, ignore_errors=True)
        t0 = time.perf_counter()
        TrajectoryQuery(storage, cache_dir=cache).sql("SELECT count(*) FROM per_version")
        print(f"query_cache_build_s {time.perf_counter() - t0:.3f}")
        cached = _timed(
            lambda: TrajectoryQuery(storage, cache_dir=cache).sql("SELECT * FROM per_version"), args.reps
        )
        _line("query_per_version_cached_s", cached)
        flt = "SELECT count(*) FROM groups WHERE reward_var > 0 AND staleness >= 1"
        _line("query_groups_filter_s", _timed(lambda: q.sql(flt), args.reps))
        if args.viewer:
            blank, page = _time_first_page(storage, args.reps, cache)
            _line("viewer_blank_page_s", blank)
            _line("viewer_first_page_s", page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
