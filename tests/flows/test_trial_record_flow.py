"""A trial's record through the real flows (Prefect server, MLflow SQLite store, CPU inference server).

The reported failures, replayed:
- a trial started with an explicit ``train.steps`` and stopped before it finished was resumed as the docs
  say (``trial=... resume=true``) and trained to the YAML's ``train.steps`` instead;
- evaluating the latest checkpoint (the ``evaluate`` flow, ``RLRun.evaluate()``) wrote its score as
  ``eval/v000000.json``, over the 'before' score.

A 3-step run stands for the interrupted one: removing the trainer's done marker and the finalization
record leaves the trial as a kill before the end would (its checkpoints and trainer state kept).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _unfinish(storage) -> None:  # noqa: ANN001
    storage.delete("trainer/DONE.json")
    storage.delete("FINALIZED.json")


def test_a_resume_keeps_the_trials_settings_and_the_before_score(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from flows.async_rl import async_rl
    from flows.evaluate import evaluate
    from rollflow.api.errors import ResumeOverrideError
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri={mlflow_uri}",
    ]
    started = [*where, "train.steps=3", "eval.every_n_versions=0", "eval.n_prompts=40"]
    first = async_rl(config="configs/tiny_cpu.yaml", overrides=started, trial="rec")  # the YAML says 100
    assert first["final_version"] == 3
    storage = Storage.open(str(tmp_path / "storage"), "tiny-arith", "rec")
    before = storage.get_json("eval/v000000.json")
    assert before["label"] == "before" and before["eval_set"].startswith("sha256:")
    split = storage.get_json("record/base-split.json")
    assert split["n"] == 40 and split["eval_set"] == before["eval_set"]
    client = MlflowClient(mlflow_uri)
    run = client.get_run(first["mlflow_run_id"])
    assert run.data.tags["rollflow.registry.eval_set"] == before["eval_set"]
    assert "rollflow.registry.metric" in run.data.tags
    version = client.get_model_version("tiny-arith-policy", "1")
    assert version.tags["eval_set_digest"] == before["eval_set"]
    if 0 < split["n_solved"] < 40:  # both halves exist: retention is in MLflow and in the decision's tags
        assert client.get_metric_history(run.info.run_id, "eval/accuracy_base_solved")
        assert "rollflow.registry.accuracy_base_unsolved" in run.data.tags

    _unfinish(storage)
    with pytest.raises(ResumeOverrideError, match="below the 3 steps"):  # would shorten the record
        async_rl(
            config="configs/tiny_cpu.yaml", overrides=[*where, "train.steps=2"], trial="rec", resume=True
        )
    # resumed as the docs say: the trial's own 3 steps, not the YAML's 100
    plain = async_rl(config="configs/tiny_cpu.yaml", overrides=where, trial="rec", resume=True)
    assert plain["final_version"] == 3, plain
    assert storage.get_json("eval/v000000.json") == before  # the 'before' score was not redone

    _unfinish(storage)
    longer = async_rl(
        config="configs/tiny_cpu.yaml", overrides=[*where, "train.steps=5"], trial="rec", resume=True
    )
    assert longer["final_version"] == 5
    tags = client.get_run(longer["mlflow_run_id"]).data.tags
    assert tags["rollflow.resume.overrides"] == "train.steps=5"
    assert storage.get_json("record/config.json")["config"]["train"]["steps"] == 5

    # stopped between training and finalization: the resume that only finalizes records its overrides too
    storage.delete("FINALIZED.json")
    fin = async_rl(
        config="configs/tiny_cpu.yaml", overrides=[*where, "rollout.max_concurrent_rollouts=16"], trial="rec",
        resume=True,
    )  # fmt: skip
    assert fin["final_version"] == 5, fin
    tags = client.get_run(fin["mlflow_run_id"]).data.tags
    assert tags["rollflow.resume.overrides"] == "train.steps=5 rollout.max_concurrent_rollouts=16", fin

    # a finished trial: a resume only reports it, and an override that would change it is refused, not dropped
    with pytest.raises(
        ResumeOverrideError, match="is finished .* start a new trial from its last checkpoint"
    ):
        async_rl(
            config="configs/tiny_cpu.yaml", overrides=[*where, "train.steps=7"], trial="rec", resume=True
        )
    assert storage.get_json("record/config.json")["config"]["train"]["steps"] == 5
    reported = async_rl(config="configs/tiny_cpu.yaml", overrides=where, trial="rec", resume=True)
    assert reported["already_finished"] and reported["final_version"] == 5

    # scoring the latest checkpoint records it under its own version, on the trial's own evaluation set
    # (its recorded 40 prompts, not the YAML's); the 'before' score stays
    scored = evaluate(config="configs/tiny_cpu.yaml", overrides=[*where, "trial=rec"])
    assert scored["checkpoint_version"] == 5 and scored["version"] == 5 and scored["n"] == 40
    assert storage.get_json("eval/v000005.json")["label"] == "v5"
    assert storage.get_json("eval/v000005.json")["eval_set"] == before["eval_set"]
    assert storage.get_json("eval/v000000.json") == before

    # v0's checkpoint collected by retention: v0 is the model.path the trial recorded, and scores as such
    import shutil

    shutil.rmtree(tmp_path / "storage" / "tiny-arith" / "rec" / "checkpoints" / "v000000", ignore_errors=True)
    assert not (
        tmp_path / "storage" / "tiny-arith" / "rec" / "checkpoints" / "v000000" / "COMMIT.json"
    ).exists()
    v0 = evaluate(config="configs/tiny_cpu.yaml", overrides=[*where, "trial=rec"], version=0)
    assert v0["checkpoint_version"] == 0 and v0["n"] == 40
    assert v0["accuracy"] == pytest.approx(before["accuracy"])  # the same model on the same prompts
