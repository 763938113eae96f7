"""``RLRun`` (flows/session.py): the Python API on the real flows, with a reward defined in the test.

The end-to-end test trains the embedded tiny model on in-memory rows with a closure as the reward (it
cannot be imported by name, so it runs in this process, ``rollflow.rewards.inprocess``), through a real
Prefect server, and checks that it learned, that the closure scored the rollouts, and that evaluate(),
trajectories() and submit()'s refusal behave. The unit tests cover turning rows into a ``files``
dataset and the in-process runner's timeout, errors and refusal in another process.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from flows.session import RLRun, SessionError, dataset_tree, reward_spec
from rollflow.rewards.inprocess import InProcessRewardError, InProcessRewardRunner, register_reward

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(n)]


def test_rows_become_a_files_dataset_with_a_seeded_held_out_tenth(tmp_path: Path) -> None:
    tree = dataset_tree(_rows(50), None, seed=3, root=tmp_path)
    assert tree["kind"] == "files" and tree["messages_field"] == "messages"
    paths = dict(part.split("=", 1) for part in tree["path"].split(","))
    train = [json.loads(x) for x in Path(paths["train"]).read_text().splitlines()]
    test = [json.loads(x) for x in Path(paths["test"]).read_text().splitlines()]
    assert len(test) == 5 and len(train) == 45
    assert {r["answer"] for r in train}.isdisjoint({r["answer"] for r in test})
    assert dataset_tree(_rows(50), None, seed=3, root=tmp_path) == tree  # same rows, same files
    assert dataset_tree(_rows(50), None, seed=4, root=tmp_path)["path"] != tree["path"]


def test_text_rows_and_bad_rows(tmp_path: Path) -> None:
    tree = dataset_tree([{"question": "1+1=", "answer": "2"}] * 3, None, seed=0, root=tmp_path)
    assert tree["prompt_field"] == "question"
    with pytest.raises(SessionError, match="'answer' column"):
        dataset_tree([{"question": "q"}] * 3, None, seed=0, root=tmp_path)
    with pytest.raises(SessionError, match="'messages'"):
        dataset_tree([{"text": "q", "answer": "a"}] * 3, None, seed=0, root=tmp_path)
    with pytest.raises(SessionError, match=r"dataset\[1\] is str"):
        dataset_tree([{"question": "q", "answer": "a"}, "oops"], None, seed=0, root=tmp_path)


def test_importable_reward_keeps_its_name_a_closure_is_registered() -> None:
    from rollflow.rewards.synthetic import synthetic_reward_fn

    assert reward_spec(synthetic_reward_fn) == "rollflow.rewards.synthetic:synthetic_reward_fn"

    def local(prompt: str, completion: str, answer: str, **data: object) -> float:
        return 1.0

    spec = reward_spec(local)
    assert spec.startswith("rollflow.rewards.inprocess:local__")
    assert reward_spec(local) == spec  # registered once


def test_in_process_runner_scores_times_out_and_counts() -> None:
    release = threading.Event()

    def reward(prompt: str, completion: str, answer: str, **data: object) -> float:
        if completion == "hang":
            release.wait(60)
        if completion == "boom":
            raise ValueError("no")
        if completion == "nan":
            return float("nan")
        return float(completion == answer)

    runner = InProcessRewardRunner(register_reward(reward), max_workers=2, timeout_s=0.5)
    t0 = time.monotonic()
    outs = asyncio.run(runner.ascore_many("p", ["4", "5", "hang", "boom", "nan"], "4"))
    release.set()
    assert [o.score for o in outs] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert (
        outs[2].timed_out and "ValueError: no" in (outs[3].error or "") and "finite" in (outs[4].error or "")
    )
    assert time.monotonic() - t0 < 30  # the hung call was given up at its timeout, not awaited
    assert runner.stats.calls == 5 and runner.stats.timeouts == 1 and runner.stats.errors == 2


def test_unregistered_in_process_name_is_refused_with_what_to_do() -> None:
    with pytest.raises(InProcessRewardError, match="lives only there"):
        InProcessRewardRunner("rollflow.rewards.inprocess:never_registered__1")


@pytest.mark.slow
def test_rlrun_trains_with_a_reward_defined_here(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollflow.api.config import SyntheticTaskConfig
    from rollflow.configuration.loader import load_config
    from rollflow.data.synthetic import synthetic_rows
    from rollflow.models.bootstrap import bootstrap_for
    from rollflow.rewards.synthetic import synthetic_reward_fn

    monkeypatch.chdir(ROOT)
    model = bootstrap_for(load_config("configs/tiny_cpu.yaml"))  # the demo's warm-started tiny model
    calls = {"n": 0}

    def exact(prompt: str, completion: str, answer: str, **data: object) -> float:  # a closure
        calls["n"] += 1
        return synthetic_reward_fn(prompt, completion, answer, **data)

    task = SyntheticTaskConfig()
    run = RLRun(
        model=model,
        dataset=synthetic_rows(task, "train"),
        eval_dataset=synthetic_rows(task, "test"),
        reward_fn=exact,
        config={
            "storage.root": str(tmp_path / "storage"),
            "storage.local_cache": str(tmp_path / "cache"),
            "tracking.mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "train.steps": 30,
            "train.lr": 3e-5,
            "eval.every_n_versions": 10,
            "eval.n_prompts": 100,
            "rollout.generation.max_new_tokens": 8,
        },
    )
    assert run.in_process_reward
    summary = run.train()
    assert summary["final_version"] == 30 and run.trial == summary["trial"]
    assert summary["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.2, summary
    assert calls["n"] >= 30 * 16 * 8  # every trained completion was scored by the closure, here

    scored = run.evaluate()
    assert scored["checkpoint_version"] == 30
    assert scored["accuracy"] == pytest.approx(summary["eval_accuracy_after"], abs=0.05)
    table = run.trajectories(limit=5)
    assert len(table) == 5 and {"prompt", "completion", "reward"} <= set(table.columns)
    with pytest.raises(SessionError, match="importable module"):
        run.submit()
