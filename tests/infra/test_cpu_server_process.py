"""The CPU server as a process: API key, clean SIGTERM shutdown, and ``ServerGroup`` handling.

One server with an API key for the module; ``launch_local_servers`` passes the key in the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from server_waits import until_generating

from infra.servers import ServerGroup, launch_local_servers, redact_command
from rollflow.api.config import InferenceConfig
from rollflow.configuration.redact import REDACTED
from rollflow.inference.sglang import cpu_server_command

KEY = "test-key-123"


def post(addr: str, path: str, body: Any, key: str | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir: Path, inference_lib: Any) -> Any:
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1, api_key=KEY) as group:
        yield group


def test_api_key_is_required_except_on_health(keyed_server: ServerGroup) -> None:
    addr = keyed_server.addresses[0]
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    assert post(addr, "/generate", body) == (401, {"error": "Unauthorized"})
    assert post(addr, "/generate", body, key="wrong-key")[0] == 401
    assert post(addr, "/pause_generation", {}, key=None)[0] == 401
    status, out = post(addr, "/generate", body, key=KEY)
    assert status == 200 and len(out["output_ids"]) == 2
    with urllib.request.urlopen(f"http://{addr}/health", timeout=5) as r:  # probes need no key (SGLang)
        assert r.status == 200
    # The key travels in the environment, not on the command line.
    assert KEY not in " ".join(keyed_server.servers[0].command)


def test_sigterm_returns_partial_output_and_exits_cleanly(keyed_server: ServerGroup) -> None:
    addr = keyed_server.addresses[0]
    out: dict[str, Any] = {}
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    t = threading.Thread(
        target=lambda: out.update(
            zip(("status", "body"), post(addr, "/generate", body, key=KEY), strict=True)
        )
    )
    t.start()
    # Mid-generation, by the server's own count, not a fixed sleep: the tiny model decodes its 1,000 tokens
    # in ~0.5 s on an idle 2-core machine (measured 0.497 s), so a 0.5 s sleep let it finish first.
    asyncio.run(until_generating(addr, 20, api_key=KEY))
    t0 = time.monotonic()
    keyed_server.stop(timeout_s=10)
    stopped_in = time.monotonic() - t0
    t.join(10)
    assert keyed_server.returncodes() == [0], keyed_server.servers[0].log_tail()
    assert stopped_in < 5.0
    assert out["status"] == 200
    assert out["body"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(out["body"]["output_ids"]) < 1000


def test_commands_and_redaction(tiny_model_dir: Path) -> None:
    cmd = cpu_server_command(tiny_model_dir, port=1234, threads=2, max_batch_size=8, weight_version="3")
    assert cmd[1:3] == ["-m", "infra.cpu_server"]
    assert cmd[cmd.index("--port") + 1] == "1234" and cmd[cmd.index("--weight-version") + 1] == "3"
    assert cmd[cmd.index("--threads") + 1] == "2" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert redact_command(["x", "--api-key", "s3cret", "--admin-api-key=k2", "--port", "1"]) == [
        "x",
        "--api-key",
        REDACTED,
        f"--admin-api-key={REDACTED}",
        "--port",
        "1",
    ]


def test_weight_updates_are_limited_to_the_weights_roots(
    tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    inside = root / "v000001"
    shutil.copytree(tiny_model_dir_b, inside)
    (root / "escape").symlink_to(tiny_model_dir_b)  # a link inside the root to a directory outside it
    cfg = InferenceConfig(n_servers=1, server_threads=1, startup_timeout_s=90.0)
    group = launch_local_servers(cfg, tiny_model_dir, weights_roots=[root])  # via $ROLLFLOW_WEIGHTS_ROOTS
    try:
        addr = group.addresses[0]
        for path in (tiny_model_dir_b, root / "escape", root / ".." / tiny_model_dir_b.name):
            body = {"model_path": str(path), "weight_version": "1"}
            status, reply = post(addr, "/update_weights_from_disk", body)
            assert status == 400 and "outside the weights roots" in reply["message"], (path, reply)
        body = {"model_path": str(inside), "weight_version": "1"}
        status, reply = post(addr, "/update_weights_from_disk", body)
        assert status == 200 and reply["success"], reply
    finally:
        group.stop(timeout_s=10)


def test_a_non_loopback_server_without_an_api_key_refuses_to_start(tiny_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROLLFLOW_INFERENCE_API_KEY"}
    cmd = [sys.executable, "-m", "infra.cpu_server", "--model-path", str(tiny_model_dir), "--host", "0.0.0.0"]
    proc = subprocess.run([*cmd, "--port", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0 without an API key" in proc.stderr
