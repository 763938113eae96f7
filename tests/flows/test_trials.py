"""Trial choice: a new trial per run by default; an existing trial only through an explicit resume."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from rollflow.api.errors import NothingToResumeError, TrialExistsError
from rollflow.trial.choice import choose_trial
from rollflow.trial.naming import expand_trial_name, named_in_overrides
from storage.finalization import mark_finalized
from storage.fs import Storage


def _opener(root: Path):
    return lambda trial: Storage.open(str(root), "exp", trial)


def test_unnamed_runs_get_fresh_distinct_trials(tmp_path: Path) -> None:
    a = choose_trial("demo", named=None, resume=False, open_storage=_opener(tmp_path))
    b = choose_trial("demo", named=None, resume=False, open_storage=_opener(tmp_path))
    assert a.trial != b.trial and a.state == b.state == "new"
    assert re.fullmatch(r"demo-\d{8}-\d{6}-[0-9a-f]{4}", a.trial), a.trial


def test_existing_trial_needs_resume_and_finished_trial_is_reported(tmp_path: Path) -> None:
    from storage.checkpoints import CheckpointStore

    st = _opener(tmp_path)("t1")
    st.put_json("trainer/state-00000002.json", {"version": 2})
    with pytest.raises(TrialExistsError, match="resume=true"):
        choose_trial("demo", named="t1", resume=False, open_storage=_opener(tmp_path))
    plan = choose_trial("demo", named="t1", resume=True, open_storage=_opener(tmp_path))
    assert (plan.trial, plan.state, plan.resume) == ("t1", "unfinished", True)
    CheckpointStore(st).mark_done({"version": 4})
    plan = choose_trial("demo", named="t1", resume=True, open_storage=_opener(tmp_path))
    assert plan.state == "trained" and plan.done["version"] == 4  # training done, finalization missing
    mark_finalized(st, {"final_version": 4})
    plan = choose_trial("demo", named="t1", resume=True, open_storage=_opener(tmp_path))
    assert plan.state == "finished" and plan.done["version"] == 4


def test_resume_needs_an_existing_trial(tmp_path: Path) -> None:
    with pytest.raises(NothingToResumeError, match="holds no data"):
        choose_trial("demo", named="nope", resume=True, open_storage=_opener(tmp_path))
    with pytest.raises(NothingToResumeError, match="trial=<name>"):
        choose_trial("demo", named=None, resume=True, open_storage=_opener(tmp_path))


def test_date_placeholder_is_the_real_date() -> None:
    now = time.mktime((2026, 11, 24, 2, 0, 5, 0, 0, 0)) - time.timezone
    assert expand_trial_name("nightly-{date}", now) == "nightly-20261124"
    assert named_in_overrides(["train.steps=3", "trial = x"]) and not named_in_overrides(["trial_x=1"])
