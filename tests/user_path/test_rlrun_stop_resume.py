"""A user's ``RLRun`` script in a folder of their own, stopped with Ctrl-C and resumed both ways.

The user's folder lies outside the checkout (no ``ROLLFLOW_PROJECT_DIR``): JSONL train/test files, a
``module:function`` reward in ``myreward.py`` beside them, and ``train.py``, a script that calls
``RLRun(model, "data/train.jsonl", myreward.exact, eval_dataset="data/test.jsonl")``. Then, as the user
would, from that folder:

1. ``python train.py``, Ctrl-C (SIGINT to its process group) after two training steps: it prints the
   "Resume it with:" line naming the trial;
2. the Python resume, ``RLRun(..., trial=T).train(resume=True)`` (``python train.py T``), Ctrl-C again
   once it trained on from the resume point;
3. ``rollflow ls`` lists the trial; ``rollflow resume ...`` exactly as the line printed it
   (the project's ``rollflow`` script, whose ``sys.path`` does not hold the folder) trains it to the end;
   ``rollflow ls`` says finalized, ``rollflow query`` reads its trajectories. Each of these looks in the
   folder's ``runs/`` (``rollflow.configuration.project_dir``), where ``RLRun`` wrote it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STEPS = 150  # enough that Ctrl-C lands mid-training (a step takes a fraction of a second)
EXPERIMENT = "rlrun-user"

REWARD = """
def exact(prompt, completion, answer, **row):
    return float(completion.strip() == answer)
"""

SCRIPT = """
import sys

from flows import RLRun
from myreward import exact

run = RLRun(
    model={model!r},
    dataset="data/train.jsonl",
    eval_dataset="data/test.jsonl",
    reward_fn=exact,
    config={config!r},
    trial=sys.argv[1] if len(sys.argv) > 1 else None,
)
summary = run.train(resume=len(sys.argv) > 1)
print("final_version", summary["final_version"])
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's folder: data, reward and script (the tiny model is the suite's, built once)."""
    from rollflow.configuration.loader import load_config
    from rollflow.models.bootstrap import bootstrap_for

    tiny = bootstrap_for(
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"model.path={ROOT / 'runs/models/tiny'}"])
    )
    home = tmp_path_factory.mktemp("user") / "proj"
    (home / "data").mkdir(parents=True)
    for split, pairs in (("train", range(10, 40)), ("test", range(40, 44))):
        rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in pairs for b in range(10, 30)]
        (home / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (home / "myreward.py").write_text(REWARD)
    config = {
        "experiment": EXPERIMENT, "train.steps": STEPS, "train.batch_size": 8, "train.lr": 3e-5,
        "train.resume_every": 1, "rollout.group_size": 4, "rollout.reward_workers": 1,
        "rollout.generation.max_new_tokens": 4, "eval.every_n_versions": 0, "eval.n_prompts": 16,
    }  # fmt: skip
    (home / "train.py").write_text(SCRIPT.format(model=str(Path(tiny).resolve()), config=config))
    return home


def _env(prefect_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in prefect_env.items() if k != "ROLLFLOW_PROJECT_DIR"}  # the folder is the project
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store: runs/mlflow in the folder
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _ctrl_c_reaches_it() -> None:  # in the child: SIGINT's default, as a terminal's foreground job has
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_after(cmd: list[str], folder: Path, env: dict[str, str], steps: int) -> str:
    """Run ``cmd`` in ``folder``, Ctrl-C it once ``steps`` training steps are stored; its output."""
    log = folder / f"run-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_ctrl_c_reaches_it,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 400
            while len(list(folder.glob("runs/storage/*/*/trainer/consumed/step-*.json"))) < steps:
                assert proc.poll() is None, log.read_text()[-4000:]
                assert time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log.read_text()


def _resume_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if "Resume it with: " in ln]
    assert len(lines) == 1, out[-4000:]
    return lines[0]


def _rollflow(words: list[str], folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The project's ``rollflow`` script (``sys.path[0]`` is its bin folder, not the user's folder)."""
    assert words[0] == "rollflow", words
    return subprocess.run(
        [sys.executable, str(BIN / "rollflow"), *words[1:]],
        cwd=folder, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip


def test_an_rlrun_trial_stopped_with_ctrl_c_resumes_from_python_and_from_the_printed_command(
    folder: Path, prefect_server: str, prefect_env: dict[str, str]
) -> None:
    env = _env(prefect_env)
    first = _stop_after([sys.executable, "train.py"], folder, env, steps=2)
    line = _resume_line(first)
    m = re.search(r"kept trial (rlrun-\S+) \(resume point at version (\d+)", line)
    assert m, line
    trial, point = m.group(1), int(m.group(2))
    assert point >= 2, line
    assert f"RLRun(..., trial='{trial}').train(resume=True)" in line, line
    assert f"(in {folder})" in line, line
    stored = folder / "runs" / "storage" / EXPERIMENT / trial
    assert stored.is_dir(), sorted(folder.glob("runs/storage/*/*"))

    second = _stop_after([sys.executable, "train.py", trial], folder, env, steps=point + 3)
    line = _resume_line(second)
    assert f"kept trial {trial} (resume point at version " in line, second[-3000:]
    point2 = int(re.search(r"resume point at version (\d+)", line).group(1))
    assert point2 > point, (point, line)  # the Python resume trained on from the first stop

    listed = _rollflow(["rollflow", "ls"], folder, env)
    assert listed.returncode == 0 and f"experiment {EXPERIMENT}" in listed.stdout, listed
    assert trial in listed.stdout and f"under {folder / 'runs' / 'storage'}" in listed.stdout, listed.stdout

    command = shlex.split(line.split("Resume it with: ", 1)[1].split(" (in ", 1)[0])
    assert command == ["rollflow", "resume", trial, f"experiment={EXPERIMENT}"], line
    done = _rollflow(command, folder, env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert f"training finished: version {STEPS}" in out and "fresh start" not in out, out[-3000:]
    assert re.search(rf"^final_version {STEPS}\b", out, re.MULTILINE), out[-3000:]

    listed = _rollflow(["rollflow", "ls"], folder, env)
    assert re.search(rf"{trial}\s+finalized", listed.stdout), listed.stdout
    sql = "SELECT count(*) AS n, count(DISTINCT group_id) AS groups FROM trained"
    queried = _rollflow(["rollflow", "query", trial, sql, "--format", "json"], folder, env)
    assert queried.returncode == 0, queried.stderr
    counts = json.loads(queried.stdout.splitlines()[0])
    assert counts == {"n": STEPS * 8, "groups": STEPS * 8}, counts  # 8 groups a step, each trained once


def test_a_trial_not_found_names_where_runs_is_and_how_to_point_there(
    folder: Path, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = _rollflow(["rollflow", "resume", "rlrun-nosuch"], elsewhere, _env(prefect_env))
    assert res.returncode == 2, res
    assert f"runs/storage is resolved in {elsewhere}" in res.stderr, res.stderr
    assert "or set ROLLFLOW_PROJECT_DIR to it" in res.stderr, res.stderr
    from storage.fs import Storage

    Storage.open(str(folder / "runs" / "storage"), "mine", "t1").put_json("trainer/DONE.json", {"version": 1})
    pointed = {**_env(prefect_env), "ROLLFLOW_PROJECT_DIR": str(folder)}
    listed = _rollflow(["rollflow", "ls"], elsewhere, pointed)
    assert listed.returncode == 0 and "experiment mine" in listed.stdout and "t1" in listed.stdout, listed
