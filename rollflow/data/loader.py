"""Prompt datasets: load a split through Hugging Face ``datasets`` and map it to rollflow's row format.

What it is. ``load_prompts(cfg, split)`` returns a list of rows

    {"prompt_id": str, "messages": [{"role": "user", "content": str}, ...], "answer": str, **passthrough}

from one of three sources (``cfg.kind``):

* ``synthetic`` - the built-in task (``rollflow.data.synthetic``); ``cfg.train_split`` gives the
  training prompts, ``cfg.eval_split`` the held-out ones.
* ``files`` - local or remote (``s3://...``, with ``storage_options``) parquet / jsonl / csv files.
  ``cfg.path`` is one of: ``"train=a.jsonl,test=b.jsonl"`` (a file or glob per split), a path with
  ``{split}`` in it (``"data/{split}.parquet"``), or one file/glob, which then serves the train split
  only (asking it for another split is an error rather than a silent train/eval leak).
* ``hub`` - a dataset name on the Hugging Face hub (``cfg.hub_config`` picks its config), online only.
* ``reasoning_gym`` - a reasoning-gym generator (``rollflow.data.reasoning_gym``); ``cfg.eval_split``
  gives its held-out rows, any other split its training rows.

The mapping is ``cfg``'s: the prompt is ``cfg.messages_field`` (a list of ``{role, content}``) if set,
else ``cfg.prompt_field`` (a string, sent as one user message); ``cfg.system_prompt`` is prepended
when the messages have no system turn; the reference is ``cfg.answer_field`` (``answer_format="gsm8k"``
keeps what follows ``####`` and checks it is a number); the id is ``cfg.id_field`` or
``"{split}-{row index}"``. Every other column passes through unchanged (the workflow hands them to
the reward function as ``**data``).

A malformed row - missing field, wrong type, empty prompt, unparseable GSM8K answer, duplicate id -
raises ``DatasetRowError`` naming the split, row index and field and saying which config key fixes it;
with ``cfg.on_bad_row="skip"`` it is dropped, counted and the count logged.

Offline note: with ``HF_HUB_OFFLINE=1`` local and s3:// files still load (datasets 5.x would refuse
s3:// under it; see ``_remote_files_allowed``); an explicit ``HF_DATASETS_OFFLINE=1`` blocks s3://.

What it is not: a data pipeline. No shuffling, epochs or batching (the rollout loop's cursor does that).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from rollflow.api.config import DatasetConfig
from rollflow.api.errors import ConfigError, DatasetFileError, DatasetRowError
from rollflow.data.synthetic import synthetic_rows
from rollflow.rewards.math import parse_gsm8k_reference, parse_number

logger = logging.getLogger(__name__)

RESERVED_FIELDS = ("prompt_id", "messages", "answer")
_OFFLINE_LOCK = threading.Lock()
_ROLES = ("system", "user", "assistant")
# "train=..." (a split name has no '/', so "data/year=2024/x.parquet" and s3:// URLs are paths).
_SPLIT_ENTRY_RE = re.compile(r"^\s*[\w.-]+\s*=")
_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".tsv": "csv",
}


class _BadRow(Exception):
    """Internal: one row's problem, turned into DatasetRowError or a skip by the caller."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.field, self.problem, self.fix = field, problem, fix


def data_files_for(cfg: DatasetConfig, split: str) -> str:
    """The file, glob or URL that holds ``split`` according to ``cfg.path`` (see the module docstring)."""
    path = cfg.path.strip()
    if "{split}" in path:
        return path.replace("{split}", split)
    parts = path.split(",")
    if all(_SPLIT_ENTRY_RE.match(part) for part in parts):
        mapping: dict[str, str] = {}
        for part in parts:
            name, _, value = part.partition("=")
            if not value.strip():
                raise ConfigError(
                    "dataset.path", f"split {name.strip()!r} has no file; write 'train=a.jsonl,...'"
                )
            mapping[name.strip()] = value.strip()
        if split not in mapping:
            raise ConfigError(
                "dataset.path",
                f"names splits {sorted(mapping)} but split {split!r} was asked; add {split}=...",
            )
        return mapping[split]
    if split != cfg.train_split:
        raise ConfigError(
            "dataset.path",
            f"names one file ({path!r}), which serves the train split {cfg.train_split!r} only, but split "
            f"{split!r} was asked; write 'train=...,{split}=...' or put '{{split}}' in the path",
        )
    return path


def file_format(cfg: DatasetConfig, data_files: str) -> str:
    """``cfg.format``, or the ``datasets`` builder name inferred from the file extension."""
    if cfg.format != "auto":
        return cfg.format
    name = PurePosixPath(data_files.split("?", 1)[0]).name.lower()
    for compression in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(compression)
    suffix = PurePosixPath(name).suffix
    if suffix not in _FORMATS:
        raise ConfigError(
            "dataset.format", f"cannot infer the format of {data_files!r}; set it to parquet, json or csv"
        )
    return _FORMATS[suffix]


def _load_raw(cfg: DatasetConfig, split: str, storage_options: dict[str, Any] | None) -> Any:
    """The split as a ``datasets.Dataset`` (imported lazily: it costs about a second)."""
    import datasets

    if cfg.kind == "hub":
        return _load_hub(cfg, split)
    data_files = data_files_for(cfg, split)
    fmt = file_format(cfg, data_files)
    kwargs: dict[str, Any] = {}
    if fmt == "csv" and data_files.lower().split("?", 1)[0].endswith((".tsv", ".tsv.gz")):
        kwargs["delimiter"] = "\t"
    with _remote_files_allowed(data_files):
        try:
            dataset = datasets.load_dataset(
                fmt,
                data_files={split: data_files},
                split=split,
                storage_options=storage_options or None,
                **kwargs,
            )
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - every reader failure becomes one named error
            raise _file_error(data_files, fmt, split, exc) from exc
    if len(dataset) == 0:
        raise DatasetFileError(
            f"dataset file(s) {data_files!r} (split {split!r}) hold no rows; point dataset.path at "
            "a file with data"
        )
    return dataset


def _load_hub(cfg: DatasetConfig, split: str) -> Any:
    """A hub dataset's split. A dataset with several configs and no ``hub_config`` is a ConfigError that
    lists them (``datasets`` says "Config name is missing"), as is a config name the dataset lacks."""
    import datasets

    try:
        return datasets.load_dataset(cfg.path, cfg.hub_config, split=split)
    except ValueError as exc:
        text = str(exc)
        if "Config name is missing" not in text and "BuilderConfig" not in text:
            raise
        names = _hub_config_names(cfg.path, text)
        listed = ", ".join(names) if names else "listed on the dataset's page"
        problem = "is not set" if cfg.hub_config is None else f"is {cfg.hub_config!r}, which it does not have"
        raise ConfigError(
            "dataset.hub_config",
            f"{problem}, and dataset {cfg.path!r} has several configs: {listed}; set hub_config to one "
            f"of them (e.g. `hub_config: {names[0] if names else 'main'}` under dataset:)",
        ) from exc


def _hub_config_names(path: str, message: str) -> list[str]:
    """The config names ``datasets`` printed in its error (``[...]`` after "available"), else asked anew."""
    match = re.search(r"[Aa]vailable(?: configs)?:\s*\[([^\]]*)\]", message)
    if match:
        return [n.strip().strip("'\"") for n in match.group(1).split(",") if n.strip()]
    import datasets

    try:
        return list(datasets.get_dataset_config_names(path))
    except Exception:  # noqa: BLE001 - the names only decorate the error
        return []


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _file_error(data_files: str, fmt: str, split: str, exc: BaseException) -> DatasetFileError:
    """``datasets``' reader failures (raw ``UnicodeDecodeError``, ``StopIteration``, "corresponds to no
    data", ``DatasetGenerationError``) as one error that names the file and says what to do."""
    where = f"dataset file(s) {data_files!r} (split {split!r}, format {fmt})"
    for cause in _causes(exc):
        if isinstance(cause, UnicodeDecodeError):
            return DatasetFileError(
                f"{where} are not UTF-8 text: byte {cause.object[cause.start : cause.start + 1]!r} at "
                f"offset {cause.start} cannot be decoded ({cause.reason}); re-encode the file as UTF-8 "
                "(for example `iconv -f latin1 -t utf-8`)"
            )
        if (
            isinstance(cause, StopIteration)
            or "corresponds to no data" in str(cause)
            or type(cause).__name__ == "EmptyDataError"
        ):
            return DatasetFileError(f"{where} are empty (no rows); point dataset.path at a file with data")
    return DatasetFileError(
        f"{where} cannot be read: {type(exc).__name__}: {exc}; check the file and dataset.format"
    )


@contextlib.contextmanager
def _remote_files_allowed(data_files: str) -> Iterator[None]:
    """Let ``datasets`` read remote *data files* while ``HF_HUB_OFFLINE=1`` keeps the hub off.

    datasets 5.x treats an unset ``HF_DATASETS_OFFLINE`` as ``HF_HUB_OFFLINE`` and then refuses
    every remote URL, s3:// included. Files the config names are not the hub, so for them the flag
    is lifted (the hub stays blocked by huggingface_hub's own flag). An explicit
    ``HF_DATASETS_OFFLINE=1`` is respected, with an error that says so.
    """
    import datasets.config

    if "://" not in data_files or data_files.startswith("file://") or not datasets.config.HF_HUB_OFFLINE:
        yield
        return
    if os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise ConfigError(
            "dataset.path",
            f"HF_DATASETS_OFFLINE=1 blocks remote data files such as {data_files!r}; unset it "
            "(HF_HUB_OFFLINE=1 alone keeps the model/dataset hub off)",
        )
    with _OFFLINE_LOCK:
        datasets.config.HF_HUB_OFFLINE = False
        try:
            yield
        finally:
            datasets.config.HF_HUB_OFFLINE = True


def _messages(cfg: DatasetConfig, row: dict[str, Any], columns: list[str]) -> list[dict[str, str]]:
    if cfg.messages_field is not None:
        key = cfg.messages_field
        if row.get(key) is None:  # columnar files fill a missing field with null
            raise _BadRow(key, "is missing or null", f"set dataset.messages_field to one of {columns}")
        value = row[key]
        if not isinstance(value, list) or not value:
            raise _BadRow(
                key, f"must be a non-empty list of {{role, content}}, got {value!r:.80}", "fix the data"
            )
        messages: list[dict[str, str]] = []
        for j, m in enumerate(value):
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("content"), str)
                or m.get("role") not in _ROLES
            ):
                raise _BadRow(
                    f"{key}[{j}]",
                    f"must be {{'role': one of {list(_ROLES)}, 'content': str}}, got {m!r:.80}",
                    "fix the data",
                )
            messages.append({"role": m["role"], "content": m["content"]})
        if not any(m["role"] == "user" and m["content"].strip() for m in messages):
            raise _BadRow(key, "has no non-empty user message", "fix the data")
    else:
        key = cfg.prompt_field
        if row.get(key) is None:
            raise _BadRow(
                key, "is missing or null", f"set dataset.prompt_field (or messages_field) to one of {columns}"
            )
        text = row[key]
        if not isinstance(text, str):
            raise _BadRow(key, f"must be a string, got {type(text).__name__} {text!r:.60}", "fix the data")
        if not text.strip():
            raise _BadRow(key, "is empty", "fix the data")
        messages = [{"role": "user", "content": text}]
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    return messages


def _answer(cfg: DatasetConfig, row: dict[str, Any], columns: list[str]) -> str:
    key = cfg.answer_field
    if row.get(key) is None:
        raise _BadRow(key, "is missing or null", f"set dataset.answer_field to one of {columns}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _BadRow(
            key, f"must be a string or number, got {type(value).__name__} {value!r:.60}", "fix the data"
        )
    text = str(value).strip()
    if not text:
        raise _BadRow(key, "is empty", "fix the data")
    if cfg.answer_format == "gsm8k":
        if isinstance(value, str) and "####" not in value:
            raise _BadRow(
                key,
                f"has no '#### <number>' GSM8K marker: {text[-60:]!r}",
                "set dataset.answer_format=plain if the column holds bare answers",
            )
        try:
            text = parse_gsm8k_reference(text)
        except ValueError as exc:
            raise _BadRow(key, str(exc), "fix the data") from None
        if parse_number(text) is None:
            raise _BadRow(key, f"GSM8K answer {text!r} is not a number", "fix the data")
    return text


def _prompt_id(cfg: DatasetConfig, row: dict[str, Any], split: str, index: int, columns: list[str]) -> str:
    if cfg.id_field is None:
        return f"{split}-{index}"
    value = row.get(cfg.id_field)
    if value is None:
        raise _BadRow(
            cfg.id_field, "is missing or null", f"set dataset.id_field to one of {columns} or to null"
        )
    if isinstance(value, (list, dict)) or not str(value).strip():
        raise _BadRow(
            cfg.id_field, f"must be a non-empty string or number, got {value!r:.60}", "fix the data"
        )
    return str(value)


def map_rows(
    cfg: DatasetConfig, records: Any, split: str, *, columns: list[str] | None = None, source: str = "dataset"
) -> list[dict[str, Any]]:
    """Map raw records (dicts) to rollflow rows, applying ``cfg.on_bad_row``; see the module docstring."""
    consumed = {cfg.prompt_field, cfg.answer_field, *RESERVED_FIELDS}
    if cfg.messages_field is not None:
        consumed.add(cfg.messages_field)
    if cfg.id_field is not None:
        consumed.add(cfg.id_field)
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    bad = 0
    first_bad = ""
    for index, record in enumerate(records):
        cols = columns if columns is not None else sorted(record)
        try:
            prompt_id = _prompt_id(cfg, record, split, index, cols)
            if prompt_id in seen:
                raise _BadRow(
                    cfg.id_field or "prompt_id",
                    f"duplicates the id {prompt_id!r} of row {seen[prompt_id]}",
                    "make the ids unique or set dataset.id_field to null",
                )
            row = {
                "prompt_id": prompt_id,
                "messages": _messages(cfg, record, cols),
                "answer": _answer(cfg, record, cols),
            }
        except _BadRow as exc:
            message = (
                f"{source} split {split!r} row {index}: field {exc.field!r} {exc.problem}; {exc.fix}, "
                "or set dataset.on_bad_row=skip to drop such rows"
            )
            if cfg.on_bad_row == "error":
                raise DatasetRowError(message) from None
            bad += 1
            first_bad = first_bad or message
            continue
        seen[prompt_id] = index
        row.update({k: v for k, v in record.items() if k not in consumed})
        rows.append(row)
    if bad:
        logger.warning(
            "%s split %r: skipped %d malformed rows of %d; first: %s",
            source,
            split,
            bad,
            bad + len(rows),
            first_bad,
        )
    return rows


def _synthetic_split(cfg: DatasetConfig, split: str) -> str:
    if split in (cfg.train_split, "train"):
        return "train"
    if split in (cfg.eval_split, "test", "eval", "validation"):
        return "test"
    raise ConfigError(
        "dataset.train_split",
        f"the synthetic task has a train split ({cfg.train_split!r}) and a held-out split "
        f"({cfg.eval_split!r}); {split!r} is neither",
    )


def load_prompts(
    cfg: DatasetConfig, split: str, *, storage_options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The rows of one split (see the module docstring), at most ``cfg.max_rows`` of them.

    Args:
        cfg: the dataset section of the experiment config.
        split: a split name, usually ``cfg.train_split`` or ``cfg.eval_split``.
        storage_options: fsspec options for remote files, e.g. ``{"endpoint_url": ..., "key": ...}``.

    Raises:
        DatasetRowError: a malformed row while ``cfg.on_bad_row == "error"``.
        DatasetFileError: a file that is not UTF-8, is empty or cannot be parsed (names the file).
        ConfigError: ``cfg.path``/``cfg.format`` cannot name the split's files.
    """
    if cfg.kind == "reasoning_gym":
        from rollflow.data.reasoning_gym import reasoning_gym_rows  # the package is imported only here

        rows = reasoning_gym_rows(cfg.reasoning_gym, "test" if split == cfg.eval_split else "train")
        return rows[: cfg.max_rows] if cfg.max_rows is not None else rows
    if cfg.kind == "synthetic":
        synthetic_split = "train" if _synthetic_split(cfg, split) == "train" else "test"
        records: Any = synthetic_rows(cfg.synthetic, synthetic_split)  # type: ignore[arg-type]
        if cfg.max_rows is not None:
            records = records[: cfg.max_rows]
        if cfg.system_prompt:
            for r in records:
                r["messages"].insert(0, {"role": "system", "content": cfg.system_prompt})
        logger.debug("synthetic split %r: %d prompts", split, len(records))
        return list(records)
    dataset = _load_raw(cfg, split, storage_options)
    if cfg.max_rows is not None and len(dataset) > cfg.max_rows:
        dataset = dataset.select(range(cfg.max_rows))
    source = cfg.path if len(cfg.path) <= 80 else "..." + cfg.path[-77:]
    try:
        rows = map_rows(cfg, dataset, split, columns=list(dataset.column_names), source=f"dataset {source!r}")
    except UnicodeDecodeError as exc:  # pyarrow's JSON reader keeps invalid UTF-8 until rows are read
        raise _file_error(source, cfg.format, split, exc) from exc
    logger.debug("dataset %r split %r: %d prompts", source, split, len(rows))
    return rows
