"""Which trajectories the viewer's list shows: ``TrajectoryFilter``, read from a page's query parameters.

What it is: the filter's fields (version range, reward range, prompt id or text, finish reason, page),
``from_params`` (validated where the input enters: a bad number is a ``ViewerInputError`` naming it),
``where`` (the SQL condition and its parameters, never user SQL) and ``params`` (the link to another page).
What it is not: the pages (``rollflow.viewer.pages``) or the queries' views (``storage.query``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollflow.api.errors import ViewerInputError

MAX_LIMIT = 500


def _num(params: Mapping[str, str], name: str, kind: type) -> Any:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ViewerInputError(
            f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ViewerInputError(f"{name}={raw!r} must be finite")
    return value


@dataclass(frozen=True)
class TrajectoryFilter:
    """Which rows the list shows; a None condition passes everything."""

    min_version: int | None = None
    max_version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    prompt: str | None = None  # a prompt id, or a substring of the decoded prompt
    finish: str | None = None  # a finish reason (stop, length, abort)
    limit: int = 50
    offset: int = 0

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> TrajectoryFilter:
        """From query-string values; ``version`` is V, LO:HI, LO: or :HI. ViewerInputError says what is wrong."""
        lo = hi = None
        text = params.get("version", "").strip()
        if text:
            a, sep, b = text.partition(":")
            try:
                lo = int(a) if a else None
                hi = (int(b) if b else None) if sep else lo
            except ValueError:
                raise ViewerInputError(
                    f"version={text!r}: write V, LO:HI, LO: or :HI with integers"
                ) from None
        limit = _num(params, "limit", int)
        offset = _num(params, "offset", int)
        if limit is not None and not 1 <= limit <= MAX_LIMIT:
            raise ViewerInputError(f"limit={limit} must be between 1 and {MAX_LIMIT}")
        if offset is not None and offset < 0:
            raise ViewerInputError(f"offset={offset} must be >= 0")
        return cls(
            min_version=lo,
            max_version=hi,
            min_reward=_num(params, "min_reward", float),
            max_reward=_num(params, "max_reward", float),
            prompt=params.get("prompt", "").strip() or None,
            finish=params.get("finish", "").strip() or None,
            limit=limit or 50,
            offset=offset or 0,
        )

    def where(self, *, can_decode: bool) -> tuple[str, list[Any]]:
        """A SQL condition with ``?`` parameters."""
        cond, args = ["true"], []
        for sql, value in (
            ("version >= ?", self.min_version),
            ("version <= ?", self.max_version),
            ("reward >= ?", self.min_reward),
            ("reward <= ?", self.max_reward),
            ("finish_reason = ?", self.finish),
        ):
            if value is not None:
                cond.append(sql)
                args.append(value)
        if self.prompt is not None:
            if can_decode:
                cond.append("(prompt_id = ? OR contains(decode(prompt_ids), ?))")
                args += [self.prompt, self.prompt]
            else:
                cond.append("prompt_id = ?")
                args.append(self.prompt)
        return " AND ".join(cond), args

    def params(self, **change: Any) -> dict[str, str]:
        version = ""
        if self.min_version is not None or self.max_version is not None:
            if self.min_version == self.max_version:
                version = str(self.min_version)
            else:
                version = f"{'' if self.min_version is None else self.min_version}:{'' if self.max_version is None else self.max_version}"
        values = {
            "version": version,
            "min_reward": "" if self.min_reward is None else repr(self.min_reward),
            "max_reward": "" if self.max_reward is None else repr(self.max_reward),
            "prompt": self.prompt or "",
            "finish": self.finish or "",
            "limit": str(self.limit),
            "offset": str(self.offset),
        }
        values.update({k: str(v) for k, v in change.items()})
        return {k: v for k, v in values.items() if v}
