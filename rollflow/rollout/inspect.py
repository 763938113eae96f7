"""Read committed trajectories back as text: prompt | completion | reward | versions.

What it is: ``read_trajectories(storage, tokenizer=..., limit=...)`` returns one dict per trajectory row
(for notebooks: ``pandas.DataFrame(rows)``), ``format_table(rows)`` renders them, and the CLI prints::

    python -m rollflow.rollout.inspect --config configs/tiny_cpu.yaml [dotted.overrides=...]
    python -m rollflow.rollout.inspect --storage-root runs/storage --experiment tiny-arith --trial trial0 \\
        [--tokenizer runs/models/tiny] [--limit 20] [--oldest] [--storage-option endpoint_url=http://...]

With ``--config`` the store, experiment, trial and tokenizer (``model.path``) come from the config.
A trial that holds nothing is ``no such trial: ...`` on stderr (status 2, with the trials that are there);
a trial without committed trajectories, or filters that match none, say so on stdout (status 1).
Filters: ``--min-reward`` / ``--max-reward``, ``--version V`` or ``--version LO:HI`` (the row's first
policy version, ``head_version``) and ``--prompt TEXT`` (a substring of the decoded prompt). Rows are
read newest commit first and reading stops once ``limit`` rows match; the version filter also skips
commit partitions that cannot match, and a tokenizer directory with ``tokenizer.json`` is read with
the ``tokenizers`` library alone (no transformers/torch import), so a call takes about a second.

The prompt is the row's tokens before its first loss token; the completion is everything after it
(for multi-turn rows that includes the feedback turns, which were not trained on). Without a tokenizer
the token ids are shown. Only shards named by a commit record are read (the storage contract).

What it is not: a verifier (the trainer's ``ShardReader`` checks sizes and checksums) or an analysis tool.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.fs import Storage
from storage.schema import TrajectoryRow, table_to_groups
from storage.shard_reader import ShardReader

logger = logging.getLogger(__name__)


class _FastDecoder:
    """``decode`` through the ``tokenizers`` library only (importing transformers costs seconds)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def _load_tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, (str, Path)):
        fast = Path(tokenizer) / "tokenizer.json"
        if fast.is_file():
            return _FastDecoder(fast)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


@dataclass(frozen=True)
class RowFilter:
    """Which rows to keep; every condition left as None passes."""

    min_reward: float | None = None
    max_reward: float | None = None
    min_version: int | None = None  # on head_version
    max_version: int | None = None
    prompt: str | None = None  # substring of the decoded prompt

    def keep(self, view: dict[str, Any]) -> bool:
        r, v = view["reward"], view["head_version"]
        return (
            (self.min_reward is None or r >= self.min_reward)
            and (self.max_reward is None or r <= self.max_reward)
            and (self.min_version is None or v >= self.min_version)
            and (self.max_version is None or v <= self.max_version)
            and (self.prompt is None or self.prompt in view["prompt"])
        )


def parse_versions(text: str) -> tuple[int | None, int | None]:
    """``"7"`` -> (7, 7); ``"5:9"`` -> (5, 9); ``":9"`` / ``"5:"`` leave a side open."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            return int(lo), int(lo)
        return (int(lo) if lo else None), (int(hi) if hi else None)
    except ValueError as exc:
        raise ValueError(f"--version {text!r}: write V, LO:HI, LO: or :HI with integers") from exc


def _text(ids: Sequence[int], tokenizer: Any) -> str:
    if tokenizer is None:
        return " ".join(str(i) for i in ids)
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def row_view(row: TrajectoryRow, tokenizer: Any = None) -> dict[str, Any]:
    """One row as plain values: ids, texts, reward, versions, lengths."""
    first = row.loss_mask.index(1) if 1 in row.loss_mask else len(row.input_ids)
    head, tail = row.head_version, row.tail_version
    return {
        "group_id": row.group_id,
        "prompt_id": row.prompt_id,
        "prompt": _text(row.input_ids[:first], tokenizer),
        "completion": _text(row.input_ids[first:], tokenizer),
        "reward": float(row.reward),
        "versions": f"v{head}" if head == tail else f"v{head}-{tail}",
        "head_version": head,
        "tail_version": tail,
        "n_turns": row.n_turns,
        "finish_reason": row.finish_reason,
        "prompt_tokens": first,
        "completion_tokens": len(row.input_ids) - first,
        "trained_tokens": sum(row.loss_mask),
        "writer": row.writer,
        "created_at": row.created_at,
    }


def read_trajectories(
    storage: Storage,
    *,
    tokenizer: Any = None,
    limit: int | None = 20,
    newest_first: bool = True,
    where: RowFilter | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` committed rows that pass ``where`` (newest commits first by default) as dicts
    (see ``row_view``)."""
    tokenizer = _load_tokenizer(tokenizer)
    where = where or RowFilter()
    # a commit's partition is its smallest head version, so partitions above max_version hold no match
    records = ShardReader(storage).list_commits(max_version=where.max_version, include_consumed=True)
    if newest_first:
        records = records[::-1]
    out: list[dict[str, Any]] = []
    for rec in records:
        if limit is not None and len(out) >= limit:
            break
        table = pq.read_table(pa.BufferReader(storage.get_bytes(rec.shard_key)))
        rows = [r for g in table_to_groups(table) for r in g.rows]
        for row in rows[::-1] if newest_first else rows:
            if limit is not None and len(out) >= limit:
                break
            view = row_view(row, tokenizer)
            if where.keep(view):
                out.append(view)
    return out


def sample_trajectories(storage: Storage, tokenizer: Any = None, *, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` rows, JSON-ready (for MLflow tables, Prefect artifacts and notebooks)."""
    return read_trajectories(storage, tokenizer=tokenizer, limit=limit, newest_first=True)


_MARKUP = re.compile(r"<\|[A-Za-z_]+\|>")  # ChatML-style special tokens: <|im_start|>, <|im_end|>, ...


def _cell(value: Any, width: int) -> str:
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "~"


def format_table(rows: Sequence[dict[str, Any]], *, width: int = 48) -> str:
    """A fixed-width table: versions | reward | turns | prompt (template markup dropped) | completion."""
    cols = [("versions", 9), ("reward", 7), ("turns", 5), ("prompt", width), ("completion", width)]
    lines = [" | ".join(name.ljust(w) for name, w in cols), "-+-".join("-" * w for _, w in cols)]
    for r in rows:
        prompt = _MARKUP.sub("", r["prompt"])
        values = [r["versions"], f"{r['reward']:.3f}", r["n_turns"], prompt, r["completion"]]
        lines.append(" | ".join(_cell(v, w).ljust(w) for v, (_, w) in zip(values, cols, strict=True)))
    return "\n".join(lines)


def no_such_trial(root: str, experiment: str, trial: str, options: dict[str, Any]) -> str:
    """The message for a trial name that holds nothing: the trials that are there, and how to list them."""
    from rollflow.configuration.project_dir import runs_hint
    from storage.trial_list import experiment_uri, trial_names

    names = trial_names(root, experiment, options)
    there = "trials there: " + ", ".join(names[-10:]) if names else "no trial is stored there"
    more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
    where = experiment_uri(root, experiment, options) + runs_hint(root)
    return f"no such trial: {trial} under {where}; {there}{more} (`rollflow ls` lists them)"


def main(argv: list[str] | None = None, prog: str = "python -m rollflow.rollout.inspect") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="experiment YAML: store, experiment, trial and tokenizer")
    p.add_argument("overrides", nargs="*", help="dotted config overrides (with --config), e.g. trial=t1")
    p.add_argument("--storage-root", default=None, help="local path, file://... or s3://bucket/prefix")
    p.add_argument("--experiment", default=None)
    p.add_argument("--trial", default=None)
    p.add_argument("--tokenizer", default=None, help="HF tokenizer dir (e.g. the model dir); else token ids")
    p.add_argument("--limit", type=int, default=20, help="rows to show (0 = all)")
    p.add_argument("--oldest", action="store_true", help="oldest commits first (default: newest)")
    p.add_argument("--width", type=int, default=48, help="width of the prompt and completion columns")
    p.add_argument("--min-reward", type=float, default=None, help="keep rows with reward >= this")
    p.add_argument("--max-reward", type=float, default=None, help="keep rows with reward <= this")
    p.add_argument("--version", default=None, help="head policy version: V, LO:HI, LO: or :HI")
    p.add_argument("--prompt", default=None, help="keep rows whose decoded prompt contains this text")
    p.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="fsspec option, e.g. endpoint_url=http://127.0.0.1:9000 (credentials: AWS_* variables)",
    )  # fmt: skip
    args = p.parse_args(argv)
    options: dict[str, Any] = {}
    if args.config:
        from rollflow.api.errors import ConfigError
        from rollflow.configuration.loader import load_config

        try:
            cfg = load_config(args.config, args.overrides)
        except ConfigError as exc:
            p.error(str(exc))
        args.storage_root = args.storage_root or cfg.storage.root
        args.experiment = args.experiment or cfg.experiment
        args.trial = args.trial or cfg.trial
        args.tokenizer = args.tokenizer or cfg.model.path
        options.update(cfg.storage.options)
    elif args.overrides:
        p.error("dotted overrides need --config")
    for name in ("storage_root", "experiment", "trial"):
        if not getattr(args, name):
            p.error(f"--{name.replace('_', '-')} is required (or give --config)")
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--storage-option {item!r}: write it as KEY=VALUE")
        options[key] = value
    storage = Storage.open(args.storage_root, args.experiment, args.trial, options)
    try:
        lo, hi = parse_versions(args.version) if args.version else (None, None)
    except ValueError as exc:
        p.error(str(exc))
    if not storage.list_dirs(""):  # nothing stored under that name: the name, not the filters, is wrong
        sys.stderr.write(
            f"{prog}: error: {no_such_trial(args.storage_root, args.experiment, args.trial, options)}\n"
        )
        return 2
    where = RowFilter(args.min_reward, args.max_reward, lo, hi, args.prompt)
    rows = read_trajectories(
        storage, tokenizer=args.tokenizer, limit=args.limit or None, newest_first=not args.oldest, where=where
    )
    if not rows:
        stored = where != RowFilter() and read_trajectories(storage, limit=1)  # the filters, or the trial?
        sys.stdout.write(
            "no committed trajectory matches the filters\n"
            if stored
            else f"trial {args.trial} holds no committed trajectories yet ({storage.root_uri})\n"
        )
        return 1
    sys.stdout.write(format_table(rows, width=args.width) + "\n")
    sys.stdout.write(f"{len(rows)} rows\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
