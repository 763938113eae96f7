"""A damaged ``checkpoints/LATEST`` does not stall weight updates: the watcher loads the newest committed
version and records an error event (real CPU server, local storage).

Before: ``{"version": -1}`` made every poll conclude "nothing newer than what is served", and
``Infinity`` made every poll fail with only a warning, so the servers kept old weights forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollflow.api.metrics import InMemorySink
from rollflow.inference.routing import control_call
from rollflow.inference.watcher import CheckpointWatcher
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, inference_lib: Any) -> Any:
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        yield group


@pytest.mark.parametrize("bad", [b'{"version": -1, "path": "x"}', b'{"version": Infinity}', b"junk"])
def test_malformed_latest_still_loads_the_newest_committed_version(
    server: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path, bad: bytes
) -> None:
    store = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"))
    sink = InMemorySink()
    w = CheckpointWatcher(store, server.addresses, cache_dir=tmp_path / "cache", metrics=sink)
    store.publish(tiny_model_dir, 0)
    assert w.poll_once() == 0
    store.publish(tiny_model_dir_b, 1)
    store.storage.put_bytes(keys.LATEST_KEY, bad)  # damaged after v1 was committed
    assert w.poll_once() == 1  # not stalled: the newest committed version is served
    assert str(control_call(server.addresses[0], "/get_model_info")["weight_version"]) == "1"
    errors = w.errors
    assert len(errors) == 1 and keys.LATEST_KEY in errors[0].message and "malformed" in errors[0].message
    assert w.poll_once() is None and len(w.errors) == 1  # one event per distinct problem, not per poll
    store.publish(tiny_model_dir, 2)  # publishing over the damaged LATEST works and repairs it
    assert store.latest_version() == 2 and w.poll_once() == 2
