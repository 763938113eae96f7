"""The SGLang launcher: the exact command it builds, and a real launch/health/stop cycle.

SGLang cannot be installed here, so the launch test puts a stand-in ``sglang/launch_server.py`` on
PYTHONPATH that parses the same flags and runs rollflow's CPU server: the launcher, health wait, GPU
placement flags and SIGTERM stop are exercised for real; only the server behind the flags differs.
"""

from __future__ import annotations

import json
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from infra.servers import redact_command
from infra.sglang_launcher import launch_sglang_servers
from rollflow.api.config import InferenceConfig, SGLangConfig
from rollflow.api.errors import ServerStartupError
from rollflow.inference.sglang import sglang_command


def test_command_has_model_host_port_tp_and_nothing_unset() -> None:
    cmd = sglang_command("/models/qwen", port=30001, host="0.0.0.0")
    assert cmd == [
        "python", "-m", "sglang.launch_server", "--model-path", "/models/qwen",
        "--host", "0.0.0.0", "--port", "30001", "--tp-size", "1",
    ]  # fmt: skip


def test_command_with_every_option() -> None:
    sg = SGLangConfig(
        python="/opt/venv/bin/python",
        tp_size=2,
        mem_fraction_static=0.8,
        extra_args=["--log-level", "warning"],
    )
    cmd = sglang_command(
        "/m", port=1, sglang=sg, api_key="k", weight_version="7", base_gpu_id=2, dtype="bfloat16"
    )
    assert cmd == [
        "/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
        "--port", "1", "--tp-size", "2", "--mem-fraction-static", "0.8", "--api-key", "k",
        "--weight-version", "7", "--base-gpu-id", "2", "--dtype", "bfloat16", "--log-level", "warning",
    ]  # fmt: skip
    assert "k" not in redact_command(cmd)[redact_command(cmd).index("--api-key") + 1]


FAKE_SGLANG = '''
"""Test stand-in for sglang.launch_server: same flags, rollflow's CPU server behind them."""
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("--model-path", "--host", "--port", "--tp-size", "--api-key", "--weight-version", "--base-gpu-id",
             "--mem-fraction-static", "--dtype"):
    p.add_argument(flag)
ns, extra = p.parse_known_args()
with open(os.environ["FAKE_SGLANG_RECORD"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "extra": extra}) + "\\n")
if os.environ.get("FAKE_SGLANG_FAIL"):
    sys.exit("CUDA error: no device")
args = ["--model-path", ns.model_path, "--host", ns.host, "--port", ns.port, "--weight-version", ns.weight_version]
if ns.api_key:
    args += ["--api-key", ns.api_key]
sys.argv = ["infra.cpu_server", *args]
import runpy
runpy.run_module("infra.cpu_server", run_name="__main__")
'''


@pytest.fixture()
def fake_sglang(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(textwrap.dedent(FAKE_SGLANG))
    return {"PYTHONPATH": str(tmp_path / "fake"), "FAKE_SGLANG_RECORD": str(tmp_path / "argv.jsonl")}


@pytest.mark.slow
def test_launch_waits_for_health_and_stops_cleanly(
    tiny_model_dir: Path, fake_sglang: dict[str, str], tmp_path: Path
) -> None:
    cfg = InferenceConfig(
        backend="sglang",
        n_servers=1,
        api_key="pod-key",
        sglang=SGLangConfig(python=sys.executable, tp_size=2, base_gpu_id=4, extra_args=["--enable-metrics"]),
    )
    group = launch_sglang_servers(cfg, tiny_model_dir, env=fake_sglang, log_dir=tmp_path / "logs")
    try:
        addr = group.addresses[0]
        req = urllib.request.Request(
            f"http://{addr}/get_model_info", headers={"Authorization": "Bearer pod-key"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["weight_version"] == "0"  # cfg.initial_weight_version
        record: dict[str, Any] = json.loads(
            Path(fake_sglang["FAKE_SGLANG_RECORD"]).read_text().splitlines()[0]
        )
        argv = record["argv"]
        assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--base-gpu-id") + 1] == "4"
        assert record["extra"] == ["--enable-metrics"]
        assert "pod-key" not in group.servers[0].log_path.read_text()
    finally:
        group.stop(timeout_s=10)
    assert group.returncodes() == [0]


def test_launch_failure_reports_the_log_tail(tiny_model_dir: Path, fake_sglang: dict[str, str]) -> None:
    cfg = InferenceConfig(backend="sglang", sglang=SGLangConfig(python=sys.executable, startup_timeout_s=60))
    with pytest.raises(ServerStartupError, match="CUDA error: no device"):
        launch_sglang_servers(cfg, tiny_model_dir, env={**fake_sglang, "FAKE_SGLANG_FAIL": "1"})
