"""SQL over a trial's committed trajectories: DuckDB views over exactly the shards commit records name.

What it is: ``TrajectoryQuery(storage).sql("SELECT ...")`` returns a pyarrow Table. Every call lists the
commit records afresh (the keys the trainer's reader lists, each record parsed as it parses them, read
once: records are immutable), so a query made while the run trains sees every shard committed so far,
and a shard without a record, or a quarantined one, is never read. It then opens an in-memory DuckDB
connection whose views read those Parquet files where they lie (and, with ``cache_dir``, a local copy
of the rows already read: ``storage.query_cache``)::

    trajectories  one row per sequence: every shard column, plus commit_id, version (= head_version),
                  prompt_tokens, completion_tokens, n_tokens, prompt_ids, completion_ids
    groups        one row per group: version, n, reward_mean, reward_var, completion_tokens_mean,
                  trained_version, staleness
    trained       one row per (step, group_id) the trainer trained on (trainer/consumed/step-*.json)
    per_version   one row per version: trajectories, groups, reward_mean, reward_var, signal_frac,
                  completion_tokens_mean / _max, staleness_mean / _max, trained_groups,
                  finish_reasons (a MAP reason -> rows), truncated_frac
    per_prompt    one row per (prompt_id, version): trajectories, groups, reward_mean,
                  completion_tokens_mean
    commits       the commit records (commit_id, writer, seq, rows, groups, min/max head version, ...)

Definitions. A row's prompt is its tokens before the first loss token (all of them if it has none) and
its completion the rest (for multi-turn rows that includes the environment's turns). A group's
``version`` is the smallest head version of its rows that have policy tokens (-1 if none do), the
trainer's ``TrajectoryGroup.head_version``; ``reward_var`` is the population variance over its rows, the
spread GRPO normalises by, and ``signal_frac`` the fraction of groups with ``reward_var > 0`` (groups
that carry a gradient). A consumed log's ``step`` is the version the update published, so a group
trained at step s has ``trained_version = s - 1`` (the weights the update started from) and
``staleness = trained_version - version``, the trainer's ``staleness_mean`` definition. Worked example:
a group made by v3 and trained by the step that published v6 has trained_version 5 and staleness 2. A
group not trained (yet, or dropped as stale) has NULL for both. ``per_version`` counts rows by their own
head version and groups by the group's version.

Where DuckDB reads from: on a local root, the files by path. On S3 the trial's fsspec filesystem, built
from ``storage.options`` (endpoint, credentials, region), is registered with the connection and DuckDB
reads ``s3://`` through it: no DuckDB extension is downloaded, and no credential enters the SQL text.
Extension auto-install is off, so nothing here reaches the network on its own.

When a ``decode`` callable is given (token ids -> text, e.g. a tokenizer's), the SQL function
``decode(ids)`` turns a list of ids into text: ``SELECT decode(completion_ids) FROM trajectories``.

What it is not: a verifier (the trainer's reader checks size and sha256 before it trains on a shard; a
query reads what a record names as it is), a writer, or a query engine of its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from storage import keys
from storage.commits import CommitRecord
from storage.errors import CorruptShardError, QueryError
from storage.fs import Storage
from storage.query_cache import Manifest, QueryCache
from storage.schema import TRAJECTORY_SCHEMA
from storage.validate import parse_commit_record

logger = logging.getLogger(__name__)

VIEWS: tuple[str, ...] = ("trajectories", "groups", "trained", "per_version", "per_prompt", "commits")

_COMMIT_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("commit_id", pa.string()),
    ("writer", pa.string()),
    ("seq", pa.int64()),
    ("partition", pa.int64()),
    ("rows", pa.int64()),
    ("groups", pa.int64()),
    ("min_head_version", pa.int64()),
    ("max_head_version", pa.int64()),
    ("size", pa.int64()),
    ("created_at", pa.float64()),
    ("shard_key", pa.string()),
)

_TRAJECTORIES = """
CREATE VIEW trajectories AS
SELECT *,
    head_version AS version,
    coalesce(list_position(loss_mask, 1::TINYINT), len(input_ids) + 1) - 1 AS prompt_tokens,
    len(input_ids) AS n_tokens,
    n_tokens - prompt_tokens AS completion_tokens,
    input_ids[1:prompt_tokens] AS prompt_ids,
    input_ids[prompt_tokens + 1:] AS completion_ids
FROM _shards
"""

_GROUPS = """
CREATE VIEW groups AS
SELECT g.*, t.step - 1 AS trained_version,
    CASE WHEN g.version >= 0 THEN t.step - 1 - g.version END AS staleness
FROM (
    SELECT group_id, any_value(prompt_id) AS prompt_id, any_value(commit_id) AS commit_id,
        coalesce(min(head_version) FILTER (WHERE head_version >= 0), -1) AS version,
        max(tail_version) AS tail_version, count(*) AS n,
        avg(reward) AS reward_mean, var_pop(reward) AS reward_var,
        avg(completion_tokens) AS completion_tokens_mean, min(created_at) AS created_at
    FROM trajectories GROUP BY group_id
) g
LEFT JOIN (SELECT group_id, min(step) AS step FROM trained GROUP BY group_id) t USING (group_id)
"""

_PER_VERSION = """
CREATE VIEW per_version AS
WITH t AS MATERIALIZED (
    SELECT group_id, version, reward, completion_tokens, finish_reason FROM trajectories
), g AS (
    SELECT group_id, coalesce(min(version) FILTER (WHERE version >= 0), -1) AS version,
        var_pop(reward) AS reward_var
    FROM t GROUP BY group_id
), gs AS (
    SELECT g.version, count(*) AS groups, avg(CASE WHEN g.reward_var > 0 THEN 1.0 ELSE 0.0 END) AS signal_frac,
        count(tr.step) AS trained_groups,
        avg(tr.step - 1 - g.version) FILTER (WHERE g.version >= 0) AS staleness_mean,
        max(tr.step - 1 - g.version) FILTER (WHERE g.version >= 0) AS staleness_max
    FROM g LEFT JOIN (SELECT group_id, min(step) AS step FROM trained GROUP BY group_id) tr USING (group_id)
    GROUP BY g.version
), r AS (
    SELECT version, count(*) AS trajectories, avg(reward) AS reward_mean, var_pop(reward) AS reward_var,
        avg(completion_tokens) AS completion_tokens_mean, max(completion_tokens) AS completion_tokens_max,
        histogram(finish_reason) AS finish_reasons,
        avg(CASE WHEN finish_reason = 'length' THEN 1.0 ELSE 0.0 END) AS truncated_frac
    FROM t GROUP BY version
)
SELECT version, coalesce(gs.groups, 0) AS groups, coalesce(r.trajectories, 0) AS trajectories,
    r.reward_mean, r.reward_var, gs.signal_frac, r.completion_tokens_mean, r.completion_tokens_max,
    gs.staleness_mean, gs.staleness_max, coalesce(gs.trained_groups, 0) AS trained_groups,
    r.finish_reasons, r.truncated_frac
FROM r FULL OUTER JOIN gs USING (version)
ORDER BY version
"""

_PER_PROMPT = """
CREATE VIEW per_prompt AS
SELECT prompt_id, version, count(*) AS trajectories, count(DISTINCT group_id) AS groups,
    avg(reward) AS reward_mean, avg(completion_tokens) AS completion_tokens_mean
FROM trajectories GROUP BY prompt_id, version
ORDER BY prompt_id, version
"""


_TRAINED_SQL = (
    "SELECT step, unnest(groups) AS group_id FROM read_json("
    "{docs}, columns = {{step: 'INTEGER', groups: 'VARCHAR[]'}}, format = 'auto')"
)


def _quote(text: str) -> str:
    return text.replace("'", "''")


def _sql_list(items: Sequence[str]) -> str:
    """A DuckDB list literal of strings, each quoted (a quote inside doubled)."""
    return "[" + ", ".join("'" + _quote(s) + "'" for s in items) + "]"


def _resume_steps(trainer_keys: Sequence[str]) -> list[int]:
    """Steps of the resume points (``trainer/state-{step:08d}.json``) among the trainer's keys, ascending."""
    return sorted(s for s in map(keys.parse_trainer_state_key, trainer_keys) if s is not None)


def _commits_table(records: Sequence[CommitRecord]) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name, _ in _COMMIT_FIELDS}
    for rec in records:
        for name, _ in _COMMIT_FIELDS:
            cols[name].append(getattr(rec, name))
    return pa.table({name: pa.array(cols[name], type=t) for name, t in _COMMIT_FIELDS})


class TrajectoryQuery:
    """DuckDB views over one trial's committed shards (module docstring). Thread-safe.

    Listing: the commit record keys are listed on every ``connect``; a record is read once (they never
    change) and parsed as the trainer's reader parses it; an unreadable one is left out with a warning
    (the reader, not a query, quarantines). The views are rebuilt only when the committed shards or
    the consumed logs changed, so a long-lived object (the viewer) pays the listing per query.

    ``cache_dir``: keep the rows of shards already read in a local ``QueryCache`` there, folding in
    new commits once at least ``fold_min`` have arrived; a query then opens a few part files plus the
    shards committed since, instead of every shard.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        decode: Callable[[list[int]], str] | None = None,
        cache_dir: str | Path | None = None,
        fold_min: int = 32,
    ) -> None:
        self.storage = storage
        self.decode = decode
        self.cache = QueryCache(cache_dir) if cache_dir is not None else None
        self.fold_min = fold_min
        self._records: dict[str, CommitRecord] = {}  # record key -> record
        self._bad: set[str] = set()  # record keys that did not parse
        self._lock = threading.Lock()
        self._db: duckdb.DuckDBPyConnection | None = None
        self._signature: tuple[tuple[str, ...], ...] | None = None

    # --- what is committed ----------------------------------------------------------------------------

    def committed(self) -> list[CommitRecord]:
        """The readable commit records, oldest first, less the quarantined commits."""
        with self._lock:
            return self._committed()

    def _committed(self, manifest: Manifest | None = None) -> list[CommitRecord]:
        if manifest is not None and not self._records:  # the records the cache holds need no GET
            self._records.update((r.key, r) for r in manifest.records.values())
        listed = [k for k in self.storage.list(keys.COMMIT_DIR) if k.endswith(".json")]
        for key in listed:
            if key in self._records or key in self._bad:
                continue
            try:
                self._records[key] = parse_commit_record(self.storage.get_bytes(key), key)
            except FileNotFoundError:
                continue  # deleted between list and get
            except CorruptShardError as e:
                logger.warning("query leaves out %s: %s", key, e)
                self._bad.add(key)
        quarantined = {
            k.rsplit("/", 1)[-1][: -len(".json")]
            for k in self.storage.list(keys.QUARANTINE_DIR)
            if k.endswith(".json")
        }
        known = (self._records.get(k) for k in listed)  # a record deleted since is not listed
        records = [r for r in known if r is not None and r.commit_id not in quarantined]
        return sorted(records, key=lambda r: (r.created_at, r.commit_id))

    def _location(self, key: str) -> str:
        path = self.storage.local_path(key)
        return str(path) if path is not None else self.storage.uri(key)

    # --- the connection -------------------------------------------------------------------------------

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection (close it after use) whose views cover the shards committed now."""
        with self._lock:
            manifest = self.cache.load() if self.cache is not None else None
            records = self._committed(manifest)
            trainer = self.storage.list(keys.TRAINER_DIR)  # consumed logs and resume points, one listing
            consumed = sorted(k for k in trainer if keys.parse_consumed_key(k) is not None)
            manifest, parts, fresh = self._cached(records, manifest)
            trained_part, consumed = self._trained(consumed, _resume_steps(trainer), manifest)
            signature = (
                tuple(r.commit_id for r in records),
                tuple(consumed),
                tuple(str(p) for p in [*parts, *([trained_part] if trained_part else [])]),
            )
            if self._db is None or signature != self._signature:
                old, self._db = self._db, self._build(records, fresh, parts, consumed, trained_part)
                self._signature = signature
                if old is not None:
                    old.close()
            return self._db.cursor()

    def _open(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        )
        if not self.storage.is_local:
            con.register_filesystem(self.storage.fs)
        return con

    def _direct(self, records: Sequence[CommitRecord]) -> str:
        """A SELECT of these commits' shard rows, read where they lie, with their commit ids."""
        files = _sql_list([self._location(r.shard_key) for r in records])
        return (
            "SELECT * EXCLUDE (filename), regexp_extract(filename, '([^/]+)\\.parquet$', 1) AS commit_id "
            f"FROM read_parquet({files}, filename = true)"
        )

    def _cached(
        self, records: Sequence[CommitRecord], m: Manifest | None
    ) -> tuple[Manifest | None, list[Path], list[CommitRecord]]:
        """(manifest, cache parts, commits to read from their shards); folds the latter in when there are
        at least ``fold_min``."""
        if self.cache is None or m is None:
            return m, [], list(records)
        if not set(m.records) <= {r.commit_id for r in records}:  # quarantined or deleted since
            self.cache.reset()
            m = Manifest()
        fresh = [r for r in records if r.commit_id not in m.records]
        if len(fresh) >= self.fold_min:
            con = self._open()
            try:
                m = self.cache.fold(con, self._direct(fresh), m, fresh)
            finally:
                con.close()
            fresh = []
        return m, list(m.parts), fresh

    def _trained(
        self, consumed: list[str], resume_steps: list[int], m: Manifest | None
    ) -> tuple[Path | None, list[str]]:
        """(cached trained part or None, consumed logs to read directly). Logs up to the newest resume
        point never change (``storage.query_cache``), so they are folded once ``fold_min`` are there."""
        if self.cache is None or m is None:
            return None, consumed
        upto = resume_steps[-1] if resume_steps else -1
        step = {k: keys.parse_consumed_key(k) or 0 for k in consumed}
        if upto < m.trained_upto:  # the resume points went backwards (deleted by hand): trust no fold
            return None, consumed
        settled = [k for k in consumed if step[k] <= upto]
        if upto > m.trained_upto and sum(step[k] > m.trained_upto for k in settled) >= self.fold_min:
            con = self._open()
            try:
                m = self.cache.fold_trained(con, _TRAINED_SQL.format(docs=self._docs(settled)), m, upto)
            finally:
                con.close()
        return m.trained, [k for k in consumed if step[k] > m.trained_upto]

    def _docs(self, consumed: Sequence[str]) -> str:
        return _sql_list([self._location(k) for k in consumed])

    def _build(
        self,
        records: Sequence[CommitRecord],
        fresh: Sequence[CommitRecord],
        parts: Sequence[Path],
        consumed: Sequence[str],
        trained_part: Path | None = None,
    ) -> duckdb.DuckDBPyConnection:
        con = self._open()
        try:
            sources = []
            if parts:
                sources.append(f"SELECT * FROM read_parquet({_sql_list([str(p) for p in parts])})")
            if fresh:
                sources.append(self._direct(fresh))
            if sources:
                con.execute("CREATE VIEW _shards AS " + " UNION ALL BY NAME ".join(sources))
            else:
                empty = TRAJECTORY_SCHEMA.empty_table().append_column("commit_id", pa.array([], pa.string()))
                con.register("_empty_shards", empty)
                con.execute("CREATE TABLE _shards AS SELECT * FROM _empty_shards")
                con.unregister("_empty_shards")
            trained = (
                [f"SELECT step, group_id FROM read_parquet('{_quote(str(trained_part))}')"]
                if trained_part
                else []
            )
            if consumed:
                trained.append(_TRAINED_SQL.format(docs=self._docs(consumed)))
            if trained:
                con.execute("CREATE VIEW trained AS " + " UNION ALL ".join(trained))
            else:
                con.execute("CREATE TABLE trained (step INTEGER, group_id VARCHAR)")
            con.register("_commits", _commits_table(records))
            con.execute("CREATE TABLE commits AS SELECT * FROM _commits")
            con.unregister("_commits")
            for ddl in (_TRAJECTORIES, _GROUPS, _PER_VERSION, _PER_PROMPT):
                con.execute(ddl)
            if self.decode is not None:
                decode = self.decode
                con.create_function(
                    "decode",
                    lambda ids: decode(list(ids)) if ids is not None else None,
                    [duckdb.list_type(duckdb.sqltypes.INTEGER)],
                    duckdb.sqltypes.VARCHAR,
                    null_handling="special",
                )
        except BaseException:
            con.close()
            raise
        return con

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run ``query`` (with ``?`` parameters) over the views; QueryError says what DuckDB refused."""
        con = self.connect()
        try:
            return con.sql(query, params=list(params) if params else None).to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(f"{e} (views: {', '.join(VIEWS)}; see docs/trajectories.md)") from None
        finally:
            con.close()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db, self._signature = None, None


def query_trajectories(
    storage: Storage,
    query: str,
    params: Sequence[Any] | None = None,
    *,
    decode: Callable[[list[int]], str] | None = None,
) -> pa.Table:
    """One query over a trial's committed trajectories (``TrajectoryQuery(storage).sql``, then closed)."""
    q = TrajectoryQuery(storage, decode=decode)
    try:
        return q.sql(query, params)
    finally:
        q.close()
