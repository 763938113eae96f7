"""The auto-resume budget in real storage (local dir and moto S3), and which failures are not resumable."""

from __future__ import annotations

import pytest

from rollflow.api.errors import ConfigError, LoopFailedError, NotResumableError, RewardFunctionError
from rollflow.rollout.worker_report import check_reward_fn
from rollflow.trial.auto_resume import AutoResumeBudget, not_resumable_reason, trial_of_flow_run
from rollflow.workflows.scoring import RewardCounts
from storage.errors import CheckpointIntegrityError
from storage.fs import Storage


def test_the_budget_is_counted_in_storage_within_its_window(storage: Storage) -> None:
    budget = AutoResumeBudget(storage, max_resumes=3, window_s=3600)
    assert [budget.charge(of="async-rl-t", now=t) for t in (0, 10, 20)] == [1, 2, 3]
    again = AutoResumeBudget(storage, max_resumes=3, window_s=3600)  # another process: same count
    with pytest.raises(NotResumableError, match="budget spent: 3 automatic resume"):
        again.charge(of="async-rl-t", now=30)
    assert again.used(now=30) == 3 and len(again.entries()) == 3  # the refusal is not recorded
    assert again.charge(of="async-rl-t", now=3601) == 3  # t=0 left the window: 10, 20, 3601
    with pytest.raises(NotResumableError, match="automatic resume is off"):
        AutoResumeBudget(storage, max_resumes=0, window_s=60).charge(of="async-rl-t")


def test_the_trial_comes_from_the_crashed_runs_name() -> None:
    assert trial_of_flow_run("async-rl-demo-20261124-235558-f1e5") == "demo-20261124-235558-f1e5"
    with pytest.raises(NotResumableError, match="before it chose its trial"):
        trial_of_flow_run("gentle-dog")


def test_failures_a_resume_would_repeat_say_why_and_others_are_resumable() -> None:
    def wrapped(cause: BaseException) -> LoopFailedError:
        try:
            raise LoopFailedError("rollout-loop", str(cause)) from cause
        except LoopFailedError as e:
            return e

    assert "config error" in str(not_resumable_reason(ConfigError("train.lr", "must be > 0")))
    assert "corrupt" in str(
        not_resumable_reason(wrapped(CheckpointIntegrityError("model.safetensors", "size")))
    )
    assert "reward function is broken" in str(not_resumable_reason(wrapped(RewardFunctionError("x"))))
    assert not_resumable_reason(wrapped(ConnectionResetError("server died"))) is None
    assert not_resumable_reason(TimeoutError()) is None


def test_a_reward_function_raising_on_every_call_is_broken() -> None:
    counts = RewardCounts(scored=63, errors=63)
    check_reward_fn(counts.as_metrics())  # not yet enough calls to say
    counts.scored = counts.errors = 64
    with pytest.raises(RewardFunctionError, match="raised on all 64"):
        check_reward_fn(counts.as_metrics())
    check_reward_fn(RewardCounts(scored=64, errors=63).as_metrics())  # one call scored: not broken
    check_reward_fn({})  # a workflow that scores nothing


def test_outside_a_deployment_run_a_failure_that_cannot_heal_is_raised_as_it_is() -> None:
    """Only a deployment's run becomes a NotResumable state (its trigger would resume it); a plain run raises."""
    from flows.auto_resume import not_resumable_state

    assert not_resumable_state(ConfigError("train.lr", "must be > 0")) is None
    assert not_resumable_state(RuntimeError("a transient failure")) is None
