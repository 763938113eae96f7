"""Size limits on a config tree: how deep it nests and how many nodes it expands to.

What it is: ``check_tree(value, key)``, run on everything the loader reads (the YAML file, ``data``,
overrides) and by redaction before it copies a tree. A YAML file can be small and still be huge once
loaded: an alias bomb (``a: &a [x, x, ...]``, ``b: &b [*a, *a, ...]``, ...) shares one list ten times per
level, so six levels are a few hundred bytes of YAML and 10^6 leaves for anything that copies the tree
(redaction, ``dataclasses.asdict``, MLflow params). A tree 20,000 levels deep makes every recursive
walk raise ``RecursionError``. Both are refused with a ``ConfigError`` naming the key:

* depth: at most ``MAX_DEPTH`` nested mappings / lists below the key (a config is about 4 deep; a
  workflow's kwargs rarely pass 10);
* expansion: at most ``MAX_NODES`` nodes counted as a copy would make them, each alias counted at every
  place it is used. The count is memoised per shared object, so checking a bomb costs its distinct
  nodes, not its expansion. A tree that contains itself (a recursive alias) exceeds the depth limit.

What it is not: a schema check (``rollflow.configuration.loader``) or a limit on string lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollflow.api.errors import ConfigError

MAX_DEPTH = 64
MAX_NODES = 100_000


def check_tree(value: Any, key: str = "<config>") -> None:
    """Raise ``ConfigError`` if ``value`` nests deeper than ``MAX_DEPTH`` or expands past ``MAX_NODES``."""
    _measure(value, key, 0, {})


def _measure(value: Any, key: str, depth: int, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(nodes, height) of ``value`` as a copy would expand it; ``memo``: id -> the same, per container."""
    if isinstance(value, Mapping):
        items = [(f"{key}.{k}", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    else:
        return 1, 0
    seen = memo.get(id(value))
    if seen is None:
        if depth >= MAX_DEPTH:
            raise ConfigError(
                key,
                f"nested deeper than {MAX_DEPTH} levels (or refers to itself through a YAML alias); "
                "flatten it",
            )
        nodes, height = 1, 0
        for child_key, child in items:
            n, h = _measure(child, child_key, depth + 1, memo)
            nodes, height = nodes + n, max(height, h + 1)
            if nodes > MAX_NODES:
                raise ConfigError(key, _too_many())
        seen = memo[id(value)] = (nodes, height)
    if depth + seen[1] > MAX_DEPTH:
        raise ConfigError(key, f"nested deeper than {MAX_DEPTH} levels; flatten it")
    return seen


def _too_many() -> str:
    return (
        f"expands to more than {MAX_NODES:,} values (YAML aliases counted at every use, as a copy "
        "would make them); a config this large is an alias bomb or data that belongs in a file"
    )
