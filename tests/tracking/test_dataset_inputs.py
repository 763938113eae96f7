"""The train split and the evaluation set are the run's MLflow dataset inputs (``MlflowTracker.
log_dataset_inputs``), with the digests the registry compares evaluation sets by: a real SQLite store and
the JSONL files ``RLRun`` writes for in-memory rows."""

from __future__ import annotations

from pathlib import Path

from flows.session import dataset_tree
from rollflow.configuration.loader import load_config
from rollflow.eval_scores import eval_set_digest
from rollflow.evaluation import eval_prompts
from rollflow.tracking.mlflow_tracker import MlflowTracker


def test_train_and_eval_sets_are_logged_as_dataset_inputs_with_their_digests(tmp_path: Path) -> None:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 20) for b in range(10, 20)]
    section = dataset_tree(rows, None, seed=1, root=tmp_path / "data")
    cfg = load_config(
        data={
            "experiment": "ds",
            "trial": "t1",
            "dataset": {**section, "reward_fn": "rollflow.rewards.synthetic:synthetic_reward_fn"},
            "tracking": {"mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        }
    )
    tracker = MlflowTracker(cfg)
    tracker.start()
    tracker.log_dataset_inputs()
    tracker.finish()
    inputs = tracker.client.get_run(tracker.run_id).inputs.dataset_inputs
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i for i in inputs}
    assert set(by_context) == {"training", "evaluation"}
    train, evals = by_context["training"], by_context["evaluation"]
    assert (train.dataset.name, evals.dataset.name) == ("ds-train", "ds-eval")
    assert '"num_rows": 90' in train.dataset.profile and '"num_rows": 10' in evals.dataset.profile
    want = eval_set_digest(eval_prompts(cfg))  # the digest the registry gate tags versions with
    assert {t.key: t.value for t in evals.tags}["rollflow.digest"] == want
    assert evals.dataset.digest == want[7:39]
    assert "test.jsonl" in evals.dataset.source and "train.jsonl" in train.dataset.source


def test_a_generated_task_logs_both_sets_without_a_warning(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """The demo's config (a synthetic task) once warned about its own evaluation set on every run."""
    import logging

    cfg = load_config(
        "configs/tiny_cpu.yaml",
        [f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "eval.n_prompts=20"],
    )
    tracker = MlflowTracker(cfg)
    tracker.start()
    with caplog.at_level(logging.WARNING, logger="rollflow.tracking.mlflow_tracker"):
        tracker.log_dataset_inputs()
    tracker.finish()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    inputs = tracker.client.get_run(tracker.run_id).inputs.dataset_inputs
    sources = {
        next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset.source for i in inputs
    }
    assert set(sources) == {"training", "evaluation"} and all("synthetic:" in s for s in sources.values())
