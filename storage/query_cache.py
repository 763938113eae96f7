"""`QueryCache`: a local copy of already-read committed shards, folded into a few Parquet files for SQL.

Why: a trial's shards are many small files (a 600-step tiny run: 1,200 of 64 rows), and opening them
costs DuckDB ~0.2 ms of CPU each, ~99 % of a per-version aggregate (the same rows in one file: 3 ms).
Shards never change once committed, so the rows of the commits read once can be kept, locally, in a
handful of files; a query then reads those parts plus the shards committed since.

Layout, under ``directory`` (``{storage.local_cache}/{experiment}/{trial}/query`` for a config):

    manifest.json         {"format": 1, "parts": [names], "records": [commit record JSON, ...],
                           "trained": name or null, "trained_upto": S}
    part-{uuid}.parquet   the shard rows of some commits, plus a ``commit_id`` column
    trained-{uuid}.parquet  (step, group_id) of the consumed logs of steps <= S

Consumed logs are folded only up to the newest resume point S: a restarted trainer rewrites the logs
of the steps after the resume point it starts from, never those at or below it.

The manifest is replaced atomically (temp file + ``os.replace``) after its part is in place, so a
reader sees whole parts only. Two processes folding at once each write their own part; the manifest of
the last one wins and the other's part is left unused (its commits are read from the shards again, and
folded by a later query). The cache is derived data: it is dropped and rebuilt when it names a commit
that is no longer committed (quarantined since, or deleted), when a part is missing, or when its
manifest cannot be read. What it is not: a source of truth (the records and shards are), nor shared
between machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from storage.commits import CommitRecord
from storage.errors import CorruptShardError

logger = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    parts: list[Path] = field(default_factory=list)
    records: dict[str, CommitRecord] = field(default_factory=dict)  # commit id -> record
    trained: Path | None = None
    trained_upto: int = -1


class QueryCache:
    """The folded parts of one trial (module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def load(self) -> Manifest:
        """What the manifest says; an empty one if there is none or it is unusable (then it is reset)."""
        try:
            doc = json.loads((self.dir / MANIFEST).read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}")
            m = Manifest(
                parts=[self.dir / str(name) for name in doc["parts"]],
                records={r.commit_id: r for r in (CommitRecord.from_json(obj) for obj in doc["records"])},
                trained=self.dir / str(doc["trained"]) if doc.get("trained") else None,
                trained_upto=int(doc.get("trained_upto", -1)),
            )
        except FileNotFoundError:
            return Manifest()
        except (ValueError, KeyError, TypeError, CorruptShardError) as e:
            logger.warning("query cache %s is unreadable (%s); rebuilding it", self.dir, e)
            self.reset()
            return Manifest()
        if not all(p.is_file() for p in [*m.parts, *([m.trained] if m.trained else [])]):
            logger.warning("query cache %s lost a part; rebuilding it", self.dir)
            self.reset()
            return Manifest()
        return m

    def _write(self, m: Manifest) -> None:
        doc = {
            "format": FORMAT,
            "parts": [p.name for p in m.parts],
            "records": [r.to_json() for r in m.records.values()],
            "trained": m.trained.name if m.trained else None,
            "trained_upto": m.trained_upto,
        }
        tmp = self.dir / f".{MANIFEST}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.dir / MANIFEST)

    def _copy(self, con: duckdb.DuckDBPyConnection, source_sql: str, prefix: str) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{prefix}-{uuid.uuid4().hex}.parquet"
        tmp = self.dir / f".{name}.tmp"
        path = str(tmp).replace("'", "''")
        con.execute(f"COPY ({source_sql}) TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
        os.replace(tmp, self.dir / name)
        return self.dir / name

    def fold(
        self, con: duckdb.DuckDBPyConnection, source_sql: str, m: Manifest, records: Sequence[CommitRecord]
    ) -> Manifest:
        """Write the rows of ``source_sql`` (a SELECT with a ``commit_id`` column) as a new part, then the
        manifest adding it and ``records``; returns the new manifest."""
        part = self._copy(con, source_sql, "part")
        new = dataclasses.replace(
            m, parts=[*m.parts, part], records={**m.records, **{r.commit_id: r for r in records}}
        )
        self._write(new)
        return new

    def fold_trained(
        self, con: duckdb.DuckDBPyConnection, source_sql: str, m: Manifest, upto: int
    ) -> Manifest:
        """Replace the trained part by the rows of ``source_sql`` (step, group_id of steps <= ``upto``)."""
        part = self._copy(con, source_sql, "trained")
        new = dataclasses.replace(m, trained=part, trained_upto=upto)
        self._write(new)  # the old trained part stays (a reader may hold it) until the next reset
        return new

    def reset(self) -> None:
        """Remove the manifest and every part (derived data: the next query reads the shards again)."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if p.name == MANIFEST or p.name.startswith(
                ("part-", ".part-", "trained-", ".trained-", f".{MANIFEST}")
            ):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
