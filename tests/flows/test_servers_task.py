"""infra.launch.weights_roots: where a launched server may load weights from."""

from __future__ import annotations

from pathlib import Path

from infra.launch import weights_roots
from rollflow.configuration.loader import load_config


def test_weights_roots_are_the_local_store_and_the_cache() -> None:
    cfg = load_config("configs/tiny_cpu.yaml", ["storage.root=runs/s", "storage.local_cache=runs/c"])
    assert weights_roots(cfg) == [Path("runs/c"), Path("runs/s")]


def test_an_object_store_root_is_not_a_weights_root() -> None:
    cfg = load_config("configs/tiny_cpu.yaml", ["storage.root=s3://bucket/rl", "storage.local_cache=/tmp/c"])
    assert weights_roots(cfg) == [Path("/tmp/c")]
