"""SQL over committed shards: a real DuckDB over shards written by the real ShardWriter, local and on
moto S3 (the `storage` fixture runs each test on both). Numbers are worked by hand from `small_trial`."""

from __future__ import annotations

import pytest
from trajectory_testlib import CharDecoder, consumed, group, small_trial, write

from storage import keys
from storage.errors import QueryError
from storage.fs import Storage
from storage.query import TrajectoryQuery


def _rows(q: TrajectoryQuery, sql: str) -> list[dict]:
    return q.sql(sql).to_pylist()


def test_views_hand_checked(storage: Storage) -> None:
    small_trial(storage)
    q = TrajectoryQuery(storage, decode=CharDecoder().decode)
    v0, v1 = _rows(q, "SELECT * FROM per_version")
    # v0: rewards 0, 1, 1, 1 -> mean 0.75, population variance (0.5625 + 3 * 0.0625) / 4 = 0.1875;
    # g0 has a reward spread, g1 none -> signal 0.5; completions 1, 2, 1, 4 tokens -> mean 2, max 4;
    # both trained by the step that published v3 (trained_version 2) -> staleness 2 - 0 = 2
    assert (v0["version"], v0["groups"], v0["trajectories"]) == (0, 2, 4)
    assert v0["reward_mean"] == pytest.approx(0.75)
    assert v0["reward_var"] == pytest.approx(0.1875)
    assert v0["signal_frac"] == pytest.approx(0.5)
    assert (v0["completion_tokens_mean"], v0["completion_tokens_max"]) == (2.0, 4)
    assert (v0["staleness_mean"], v0["staleness_max"], v0["trained_groups"]) == (2.0, 2, 2)
    assert dict(v0["finish_reasons"]) == {"stop": 4} and v0["truncated_frac"] == 0.0
    # v1: "3" and the 25-character script answer, both cut at 'length', never trained
    assert (v1["version"], v1["groups"], v1["trajectories"], v1["reward_mean"]) == (1, 1, 2, 0.0)
    assert (v1["completion_tokens_mean"], v1["completion_tokens_max"]) == (13.0, 25)
    assert (v1["staleness_mean"], v1["trained_groups"], v1["truncated_frac"]) == (None, 0, 1.0)

    g0 = _rows(q, "SELECT * FROM groups WHERE group_id = 'g0'")[0]
    assert (g0["n"], g0["reward_mean"], g0["reward_var"], g0["trained_version"], g0["staleness"]) == (
        2,
        0.5,
        0.25,
        2,
        2,
    )
    assert _rows(q, "SELECT staleness FROM groups WHERE group_id = 'g2'") == [{"staleness": None}]
    assert _rows(
        q, "SELECT version, trajectories, reward_mean FROM per_prompt WHERE prompt_id = 'p-same'"
    ) == [
        {"version": 0, "trajectories": 2, "reward_mean": 0.5},
        {"version": 1, "trajectories": 2, "reward_mean": 0.0},
    ]
    row = _rows(
        q,
        "SELECT prompt_tokens, completion_tokens, decode(prompt_ids) AS p, decode(completion_ids) AS c, "
        "commit_id FROM trajectories WHERE traj_id = 'g2-1'",
    )[0]
    assert (row["prompt_tokens"], row["completion_tokens"], row["p"], row["c"]) == (
        4,
        25,
        "1+1=",
        "<script>alert(1)</script>",
    )
    commits = _rows(q, "SELECT commit_id, rows, groups FROM commits ORDER BY seq")
    assert row["commit_id"] in {c["commit_id"] for c in commits}
    assert sum(c["rows"] for c in commits) == 6 and sum(c["groups"] for c in commits) == 3
    assert _rows(q, "SELECT count(*) AS n FROM trained") == [{"n": 2}]
    # parameters
    assert (
        q.sql("SELECT count(*) AS n FROM trajectories WHERE reward >= ?", [1.0]).column("n")[0].as_py() == 3
    )


def test_only_committed_shards_and_new_commits_seen(storage: Storage) -> None:
    """A shard without a record is invisible, a quarantined commit too; a later commit shows in the next
    query of the same object (a fresh listing per query: a run that trains)."""
    write(storage, [group("g0", "a", [("b", 1.0)], version=0)])
    q = TrajectoryQuery(storage)
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 1}]
    # an orphan shard (a writer died between the shard and its record): copied bytes under a new key
    (rec,) = q.committed()
    storage.put_bytes("trajectories/data/orphan-00000000.parquet", storage.get_bytes(rec.shard_key))
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 1}]
    write(storage, [group("g1", "a", [("c", 0.0), ("d", 0.0)], version=1)])
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 3}]
    consumed(storage, 2, ["g1"])
    assert _rows(q, "SELECT group_id, staleness FROM groups WHERE staleness IS NOT NULL") == [
        {"group_id": "g1", "staleness": 0}
    ]
    storage.put_json(keys.quarantine_key(rec.commit_id), {"commit_id": rec.commit_id, "reason": "test"})
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 2}]


def test_empty_trial_and_bad_sql(storage: Storage) -> None:
    q = TrajectoryQuery(storage)
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 0}]
    assert _rows(q, "SELECT * FROM per_version") == []
    assert _rows(q, "SELECT count(*) AS n FROM groups") == [{"n": 0}]
    with pytest.raises(QueryError, match="per_version"):
        q.sql("SELECT * FROM no_such_view")


def test_local_cache_folds_and_follows_the_record(storage: Storage, tmp_path) -> None:  # noqa: ANN001
    """With a cache dir, read shards are folded into local parts; the answers are the uncached ones,
    new commits still show, and a quarantined commit drops the cache (rebuilt without it)."""
    small_trial(storage)  # 3 groups in 2 shards (flush every 4 rows)
    sql = "SELECT version, groups, trajectories, reward_mean, staleness_mean FROM per_version"
    plain = _rows(TrajectoryQuery(storage), sql)
    cache_dir = tmp_path / "cache"
    q = TrajectoryQuery(storage, cache_dir=cache_dir, fold_min=2)
    assert _rows(q, sql) == plain
    assert len(list(cache_dir.glob("part-*.parquet"))) == 1
    assert _rows(TrajectoryQuery(storage, cache_dir=cache_dir, fold_min=2), sql) == plain  # a new process
    write(storage, [group("g3", "9+9=", [("18", 1.0)], version=1)])  # 1 commit: below fold_min, read directly
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 7}]
    assert len(list(cache_dir.glob("part-*.parquet"))) == 1
    first = q.committed()[0]
    storage.put_json(keys.quarantine_key(first.commit_id), {"commit_id": first.commit_id, "reason": "test"})
    assert _rows(q, "SELECT count(*) AS n FROM trajectories") == [{"n": 7 - first.rows}]
    # consumed logs up to the newest resume point (a restart never rewrites them) are folded too
    storage.put_json(keys.trainer_state_key(3), {"step": 3})
    trained = "SELECT step, group_id FROM trained ORDER BY group_id"
    assert _rows(TrajectoryQuery(storage, cache_dir=cache_dir, fold_min=1), trained) == [
        {"step": 3, "group_id": "g0"},
        {"step": 3, "group_id": "g1"},
    ]
    assert len(list(cache_dir.glob("trained-*.parquet"))) == 1
    (cache_dir / "manifest.json").write_text("{not json")
    assert _rows(TrajectoryQuery(storage, cache_dir=cache_dir), "SELECT count(*) AS n FROM trajectories") == [
        {"n": 7 - first.rows}
    ]
