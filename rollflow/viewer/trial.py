"""A trial's trajectory store from its config: the query object, with the run's tokenizer when it is there.

What it is: ``open_query(cfg, trial)`` -> ``storage.query.TrajectoryQuery`` over the trial's storage (the
config's root, experiment and ``storage.options``), whose ``decode(ids)`` SQL function uses the model's
tokenizer (``model.path``; a directory with ``tokenizer.json`` is read with the ``tokenizers`` library
alone), keeping the rows it has read in ``{storage.local_cache}/{experiment}/{trial}/query``
(``storage.query_cache``); ``query_trial(cfg, sql)`` runs one query; ``trajectory_report(cfg)`` is the viewer's static
page of the run's last versions, which finalization logs to MLflow as ``trajectories/viewer.html``.
The CLI's ``rollflow query`` / ``view`` and ``RLRun.query`` go through here.

What it is not: the views (``storage.query``) or the pages (``pages``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from rollflow.api.config import ExperimentConfig
from rollflow.trial.store import open_trial_storage
from storage.query import TrajectoryQuery

logger = logging.getLogger(__name__)


def load_decoder(model_path: str | None) -> Any:
    """The tokenizer of ``model_path`` (anything with ``decode(ids, skip_special_tokens=)``), or None when
    there is no tokenizer there (the pages then show token ids)."""
    path = Path(model_path) if model_path else None
    if path is None or not any(
        (path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    from rollflow.rollout.inspect import _load_tokenizer

    try:
        return _load_tokenizer(model_path)
    except Exception as exc:  # a model dir without a usable tokenizer: show ids
        logger.warning("no tokenizer in %s (%s); showing token ids", model_path, type(exc).__name__)
        return None


def open_query(cfg: ExperimentConfig, trial: str | None = None, *, decoder: Any = None) -> TrajectoryQuery:
    """The query object of ``trial`` (default ``cfg.trial``); SQL ``decode(ids)`` exists when ``decoder`` is given."""
    decode = None
    if decoder is not None:

        def decode(ids: list[int]) -> str:
            return decoder.decode(ids, skip_special_tokens=False)

    cache = Path(cfg.storage.local_cache) / cfg.experiment / (trial or cfg.trial) / "query"
    return TrajectoryQuery(open_trial_storage(cfg, trial), decode=decode, cache_dir=cache)


def query_trial(
    cfg: ExperimentConfig, sql: str, params: Sequence[Any] | None = None, *, trial: str | None = None
) -> pa.Table:
    """One SQL query over the trial's committed trajectories (views: ``storage.query``)."""
    decoder = load_decoder(cfg.model.path) if "decode" in sql.lower() else None
    q = open_query(cfg, trial, decoder=decoder)
    try:
        return q.sql(sql, params)
    finally:
        q.close()


def trajectory_report(cfg: ExperimentConfig, trial: str | None = None, *, last_versions: int = 5) -> str:
    """The viewer's static page for the trial's last versions (``pages.static_report``); "" (and a
    warning) if it cannot be built: a report must never fail the run it describes."""
    from rollflow.viewer.pages import static_report

    try:
        decoder = load_decoder(cfg.model.path)
        q = open_query(cfg, trial, decoder=decoder)
        try:
            title = f"{cfg.experiment} / {trial or cfg.trial}: trajectories"
            return static_report(q, decoder, title=title, last_versions=last_versions)
        finally:
            q.close()
    except Exception as exc:
        logger.warning("no trajectory report: %s: %s", type(exc).__name__, exc)
        return ""


def _cell(value: Any, width: int) -> str:
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, list) and value and isinstance(value[0], tuple):  # a MAP: [(key, value), ...]
        text = "{" + ", ".join(f"{k}: {v}" for k, v in value) + "}"
    else:
        text = "NULL" if value is None else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "~"


def _json_value(value: Any, typ: pa.DataType) -> Any:
    """``value`` of Arrow type ``typ`` as JSON shows it: a MAP as an object (keys as text; Arrow's Python
    value is a list of pairs), inside lists and structs too."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return {str(k): _json_value(v, typ.item_type) for k, v in value}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_json_value(v, typ.value_type) for v in value]
    if pa.types.is_struct(typ):
        return {f.name: _json_value(value[f.name], f.type) for f in typ}
    return value


def format_result(table: pa.Table, fmt: str = "table", *, max_rows: int = 200, width: int = 60) -> str:
    """A query result as text: ``table`` (fixed-width columns, the first ``max_rows`` rows), ``csv`` or
    ``json`` (one object per line; a MAP column is an object, as the table shows it). Plain Python:
    pandas would cost a second of import per call."""
    rows = table.to_pylist()
    names = table.column_names
    if fmt == "json":
        types = dict(zip(names, table.schema.types, strict=True))
        return "".join(
            json.dumps({n: _json_value(v, types[n]) for n, v in r.items()}, default=str) + "\n" for r in rows
        )
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([[_cell(r[n], 1 << 30) for n in names] for r in rows])
        return out.getvalue()
    cells = [[_cell(r[n], width) for n in names] for r in rows[:max_rows]]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]
    lines = [
        "  ".join(n.rjust(w) if num else n.ljust(w) for n, w, num in zip(names, widths, numeric, strict=True))
    ]
    for c in cells:
        lines.append(
            "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(c, widths, numeric, strict=True))
        )
    more = f", the first {max_rows} shown" if len(rows) > max_rows else ""
    return "\n".join(line.rstrip() for line in lines) + f"\n({len(rows)} rows{more})\n"
