"""A command-line run stopped from outside.

- SIGTERM ends it with the MLflow run KILLED; SIGKILL of the flow process leaves no orphan (inference
  servers, reward workers, nor the private Prefect API server).
- Ctrl-C (SIGINT to the terminal's foreground process group) prints one line, no traceback: the trial
  kept, its resume point, and the command that resumes it; exit status 130.
- SIGKILL mid-run: the resumed run adopts the prompt blocks the dead run held open.
- SIGKILL right after training ends (trainer/DONE.json written, finalization not done): the resume
  finalizes the trial once (final evaluation, registry decision, MLflow run FINISHED, in the same run);
  a second resume changes nothing and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _tagged(tag: str) -> dict[int, str]:
    """pid -> command line of the processes that carry ``tag`` in their environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag.encode() in environ:
            found[int(proc.name)] = cmdline
    return found


def _env(tmp_path: Path, tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true", PYTHONPATH=str(ROOT),
    )  # fmt: skip
    env[tag.split("=")[0]] = tag.split("=")[1]
    return env


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train.steps=10000", "eval.every_n_versions=0", "eval.n_prompts=16",
        f"storage.root={tmp_path / 'storage'}", f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", *extra,
    ]  # fmt: skip


def _start(
    tmp_path: Path, name: str, *extra: str, until: str = "checkpoints/LATEST", poll_s: float = 1.0
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``python -m flows.async_rl`` on trial ``name`` (its own session, as a terminal's foreground job),
    returned once the trial's key ``until`` exists."""
    tag = f"ROLLFLOW_TEST_TAG=interrupt-{name}-{os.getpid()}"
    cmd = [
        sys.executable, "-m", "flows.async_rl", "--config", "configs/tiny_cpu.yaml", "--trial", name,
        *_overrides(tmp_path, *extra),
    ]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (outlives this function)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(tmp_path, tag),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_ctrl_c_reaches_it,
    )
    wanted = tmp_path / "storage" / "tiny-arith" / name / until
    deadline = time.monotonic() + 600
    try:
        while not wanted.exists():
            assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the run never wrote {until}"
            time.sleep(poll_s)
    except BaseException:
        _kill_tree(proc, tag)
        raise
    return proc, tag, tmp_path / f"{name}.log"


def _ctrl_c_reaches_it() -> None:  # runs in the child between fork and exec
    """Give the run SIGINT's default disposition, as a terminal's foreground job has. A test suite started
    in the background of a non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler: Ctrl-C could not reach the run at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_tree(proc: subprocess.Popen[bytes], tag: str) -> None:
    """Clean up after a failed test: the run and whatever carries its tag."""
    proc.kill()
    proc.wait()
    for pid in _tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(tag: str, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def test_sigkill_of_the_flow_process_leaves_no_orphan(tmp_path: Path) -> None:
    proc, tag, _ = _start(tmp_path, "killed")
    try:
        # LATEST can name the initial weights before the rollout loop has started its reward workers:
        # wait until every kind of child is there.
        api_app = "prefect.server.api.server:create_app"
        kinds = (api_app, "cpu_server", "rollflow.rewards.worker")
        deadline = time.monotonic() + 300
        while True:
            children = _tagged(tag)
            children.pop(proc.pid, None)
            if all(any(k in c for c in children.values()) for k in kinds):
                break
            assert proc.poll() is None and time.monotonic() < deadline, children
            time.sleep(1)
        api = [c for c in children.values() if api_app in c]
        assert len(api) == 1, children  # the private API server, and no Prefect temporary server beside it
        proc.kill()
        proc.wait()
        assert not _wait_gone(tag, 60), "processes outlived a SIGKILL of the flow process"
    finally:
        _kill_tree(proc, tag)


def test_sigterm_stops_the_run_and_marks_it_killed(tmp_path: Path) -> None:
    proc, tag, log = _start(tmp_path, "stopped")
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_tree(proc, tag)
        pytest.fail("the run did not exit within 120 s of SIGTERM:\n" + log.read_text()[-3000:])
    assert rc != 0
    assert not _wait_gone(tag, 30), "processes outlived the stopped run"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-arith")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.`rollflow.trial` = 'stopped'")
    assert run.info.status == "KILLED", run.info.status


def test_ctrl_c_prints_what_was_kept_and_the_resume_command(tmp_path: Path) -> None:
    proc, tag, log = _start(tmp_path, "ctrl-c", until="trainer/consumed/step-00000002.json")  # mid-training
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground group
    t0 = time.monotonic()
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # every thread's stack into the log (faulthandler)
        time.sleep(3)
        _kill_tree(proc, tag)
        pytest.fail("the run did not exit within 120 s of Ctrl-C:\n" + log.read_text()[-12000:])
    exit_s = time.monotonic() - t0
    out = log.read_text()
    assert rc == 130, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("rollflow: stopped by Ctrl-C"))
    assert "kept trial ctrl-c (resume point at version " in line, line
    assert "Resume it with: rollflow resume ctrl-c --config configs/tiny_cpu.yaml train.steps=10000" in line
    assert not _wait_gone(tag, 30), "processes outlived the interrupted run"
    print(f"exit {exit_s:.1f}s after Ctrl-C; {line}")


def _resume(tmp_path: Path, name: str, *extra: str) -> str:
    tag = f"ROLLFLOW_TEST_TAG=interrupt-{name}-resume-{os.getpid()}"
    cmd = [
        sys.executable, "-m", "flows.async_rl", "--config", "configs/tiny_cpu.yaml", "--trial", name,
        "--resume", *_overrides(tmp_path, "train.steps=3", *extra),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path, tag), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _history(client: Any, run_id: str, name: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, name))


def test_a_trial_killed_after_training_is_finalized_by_its_resume_once(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from storage import keys

    proc, tag, log = _start(tmp_path, "after-done", "train.steps=3", until=keys.TRAINER_DONE_KEY, poll_s=0.02)
    proc.kill()  # training done, finalization not (yet) done
    proc.wait()
    assert not _wait_gone(tag, 60)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-arith")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.`rollflow.trial` = 'after-done'")
    assert run.info.status == "RUNNING", "the kill came too late: the run was already finalized"
    finalized = tmp_path / "storage" / "tiny-arith" / "after-done" / keys.FINALIZED_KEY
    assert not finalized.exists()

    out = _resume(tmp_path, "after-done")
    assert "had trained to version 3; finalized now" in out, out
    run = client.get_run(run.info.run_id)  # the same run, ended
    assert run.info.status == "FINISHED" and run.info.end_time
    final_evals = [m for m in client.get_metric_history(run.info.run_id, "eval/accuracy") if m.step == 3]
    assert len(final_evals) == 1, final_evals
    assert run.data.tags["rollflow.registry.decision"] in ("registered", "skipped"), run.data.tags
    assert finalized.exists()
    n_versions = len(client.search_model_versions("name = 'tiny-arith-policy'"))
    evals = _history(client, run.info.run_id, "eval/accuracy")

    again = _resume(tmp_path, "after-done")
    assert "had already finished at version 3; nothing done" in again, again
    run2 = client.get_run(run.info.run_id)
    assert (run2.info.status, run2.info.end_time) == ("FINISHED", run.info.end_time)
    assert _history(client, run.info.run_id, "eval/accuracy") == evals  # nothing scored again
    assert run2.data.tags == run.data.tags
    assert len(client.search_model_versions("name = 'tiny-arith-policy'")) == n_versions


def test_a_resumed_trial_adopts_the_prompt_blocks_its_killed_run_left_open(tmp_path: Path) -> None:
    """SIGKILL mid-run: the resumed run (same trial, same worker) adopts every block the dead run held
    open, at once (``rollout.worker_lease_s`` is long here, so no lease expiry could do it instead)."""
    lease = "rollout.worker_lease_s=3600"
    proc, tag, log = _start(tmp_path, "adopt", lease)
    rollout_dir = tmp_path / "storage" / "tiny-arith" / "adopt" / "rollout"
    deadline = time.monotonic() + 300
    try:
        while True:  # a state file that holds open blocks: prompts claimed but not committed
            held = {}
            for f in rollout_dir.glob("state-*.json"):
                with contextlib.suppress(OSError, ValueError):
                    held = json.loads(f.read_text()).get("blocks") or {}
            if held:
                break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        _kill_tree(proc, tag)
    dead = {}
    for f in rollout_dir.glob("state-*.json"):
        dead.update(json.loads(f.read_text()).get("blocks") or {})
    assert dead
    out = _resume(tmp_path, "adopt", lease)
    takeovers = tmp_path / "storage" / "tiny-arith" / "adopt" / "prompts" / "takeovers"
    for block, info in dead.items():
        assert (takeovers / f"{int(block):010d}-{int(info['gen']) + 1:03d}.json").exists(), (
            block,
            out[-3000:],
        )
    print(f"blocks open at the kill: {sorted(dead)}")
