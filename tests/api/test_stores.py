"""The storage contracts in rollflow.api.stores match what storage/ and the client implement.

A Protocol that drifts from its implementation is a silent lie: this compares every member's name and
parameters (names, kinds and defaults) between each contract and the class that fulfils it.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from rollflow.api import stores
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter

PAIRS = [
    (stores.ObjectStore, Storage),
    (stores.ShardSink, ShardWriter),
    (stores.ShardSource, ShardReader),
    (stores.CheckpointSink, CheckpointStore),
    (stores.CheckpointSource, CheckpointStore),
]


def _members(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize(("protocol", "impl"), PAIRS, ids=[f"{p.__name__}-{i.__name__}" for p, i in PAIRS])
def test_each_contract_member_exists_with_the_same_parameters(protocol: type, impl: type) -> None:
    members = _members(protocol)
    assert members, protocol
    for name in members:
        assert hasattr(impl, name), f"{impl.__name__} lacks {protocol.__name__}.{name}"
        expected = _params(getattr(protocol, name))
        # The implementation may take more keyword-only options (with defaults) than the contract names.
        got = [p for p in _params(getattr(impl, name)) if p[0] in {e[0] for e in expected}]
        assert got == expected, f"{impl.__name__}.{name}: {got} != {protocol.__name__}.{name}: {expected}"


def test_object_store_attributes_exist_on_an_open_store(tmp_path: Any) -> None:
    store = Storage.open(str(tmp_path), "exp", "trial")
    assert isinstance(store, stores.ObjectStore) and store.is_local
