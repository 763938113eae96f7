"""A trial remembers its own settings (``rollflow.trial.resume_policy``), on a real local ``Storage``.

The reported failure: a trial started with ``train.steps=200`` and resumed as ``trial=... resume=true``
re-read the YAML (100) and finished at 100. Here the record wins, an override on resume is explicit,
recorded and checked, and credentials never reach the record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollflow.api.errors import ResumeOverrideError
from rollflow.configuration.loader import load_config
from rollflow.trial.record import read_config_record
from rollflow.trial.resume_policy import pinned_overrides, resume_tags, settle_config
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.keys import CONFIG_RECORD_KEY as CONFIG_KEY

YAML = "configs/tiny_cpu.yaml"  # train.steps: 100
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Storage:
    monkeypatch.chdir(ROOT)
    return Storage.open(str(tmp_path / "store"), "tiny-arith", "t1")


def _cfg(*overrides: str):  # noqa: ANN202
    return load_config(YAML, ["trial=t1", *overrides])


def _trained_to(storage: Storage, version: int, tmp: Path) -> None:
    """Commit a (tiny, fake-weights) checkpoint at ``version``: the trial trained that far."""
    d = tmp / f"ckpt{version}"
    d.mkdir()
    (d / "config.json").write_text("{}")
    CheckpointStore(storage).publish(d, version)


def test_a_resume_keeps_the_steps_the_trial_started_with(trial: Storage, tmp_path: Path) -> None:
    started = settle_config(trial, _cfg("train.steps=200", "train.lr=3e-4"), state="new", overrides=[])
    assert started.cfg.train.steps == 200
    _trained_to(trial, 65, tmp_path)

    warned: list[str] = []
    resumed = settle_config(trial, _cfg(), state="unfinished", overrides=["trial=t1"], warn=warned.append)
    assert resumed.cfg.train.steps == 200  # the YAML says 100: the record wins
    assert resumed.cfg.train.lr == 3e-4
    assert resumed.ignored["train.steps"] == (200, 100)
    assert "train.steps=200" in warned[0] and "100" in warned[0]
    assert resumed.overrides == [] and resume_tags(resumed) == {}
    # a process that resolves the YAML again (distributed children) gets the recorded values back
    assert load_config(YAML, ["trial=t1", *pinned_overrides(resumed)]).train.steps == 200


def test_an_override_on_resume_is_explicit_recorded_and_kept(trial: Storage, tmp_path: Path) -> None:
    settle_config(trial, _cfg("train.steps=200"), state="new", overrides=[])
    _trained_to(trial, 65, tmp_path)
    warned: list[str] = []
    resumed = settle_config(
        trial, _cfg("train.steps=300"), state="unfinished", overrides=["train.steps=300"], warn=warned.append
    )
    assert resumed.cfg.train.steps == 300
    assert resume_tags(resumed) == {"rollflow.resume.overrides": "train.steps=300"}
    assert any("resume overrides of t1: train.steps=300" in w for w in warned)
    # the record now says 300 and remembers the override; a plain resume keeps 300
    record = read_config_record(trial)
    assert record is not None and record["config"]["train"]["steps"] == 300
    assert record["resumes"][-1]["overrides"] == ["train.steps=300"]
    again = settle_config(trial, _cfg(), state="unfinished", overrides=["trial=t1"])
    assert again.cfg.train.steps == 300
    assert resume_tags(again) == {"rollflow.resume.overrides": "train.steps=300"}  # the history


@pytest.mark.parametrize(
    ("override", "what"),
    [
        ("train.steps=50", "below the 65 steps"),
        ("dataset.synthetic.seed=9", "cannot change on resume"),
        ("model.path=/elsewhere", "cannot change on resume"),
        ("eval.n_prompts=7", "cannot change on resume"),
        ("seed=3", "cannot change on resume"),
    ],
)
def test_an_override_that_would_break_the_record_is_refused(
    trial: Storage, tmp_path: Path, override: str, what: str
) -> None:
    settle_config(trial, _cfg("train.steps=200"), state="new", overrides=[])
    _trained_to(trial, 65, tmp_path)
    before = trial.get_bytes(CONFIG_KEY)
    with pytest.raises(ResumeOverrideError, match=what) as err:
        settle_config(trial, _cfg(), state="unfinished", overrides=[override])
    assert override.split("=")[0] in str(err.value)
    assert trial.get_bytes(CONFIG_KEY) == before  # nothing recorded for a refused resume


def test_repeating_a_recorded_value_is_not_an_override(trial: Storage, tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    settle_config(trial, _cfg(f"storage.root={root}", "train.steps=200"), state="new", overrides=[])
    resumed = settle_config(
        trial,
        _cfg(f"storage.root={root}"),
        state="unfinished",
        overrides=[f"storage.root={root}", "trial=t1"],
    )
    assert resumed.overrides == [] and resumed.cfg.train.steps == 200 and resumed.cfg.storage.root == root


def test_credentials_never_reach_the_record_and_come_from_the_present(trial: Storage) -> None:
    settle_config(trial, _cfg("inference.api_key=first-s3cr3t"), state="new", overrides=[])
    raw = trial.get_bytes(CONFIG_KEY).decode()
    assert "first-s3cr3t" not in raw
    assert json.loads(raw)["config"]["inference"]["api_key"] == "***"
    resumed = settle_config(trial, _cfg("inference.api_key=now-s3cr3t"), state="unfinished", overrides=[])
    assert resumed.cfg.inference.api_key == "now-s3cr3t"
    assert "inference.api_key" not in resumed.ignored


def test_a_trial_without_a_record_keeps_its_config_and_gets_one(trial: Storage) -> None:
    trial.put_json("rollout/state-w0.json", {"updated_at": 0})  # a trial made before records existed
    cfg = _cfg("train.steps=40")
    resumed = settle_config(trial, cfg, state="unfinished", overrides=[])
    assert resumed.cfg is cfg
    record = read_config_record(trial)
    assert record is not None and record["config"]["train"]["steps"] == 40


def test_a_trained_trial_cannot_be_extended_by_a_resume(trial: Storage, tmp_path: Path) -> None:
    settle_config(trial, _cfg("train.steps=200"), state="new", overrides=[])
    _trained_to(trial, 200, tmp_path)
    with pytest.raises(ResumeOverrideError, match="only finalizes it"):
        settle_config(trial, _cfg(), state="trained", overrides=["train.steps=300"])
    assert settle_config(trial, _cfg(), state="trained", overrides=[]).cfg.train.steps == 200


def test_a_key_given_twice_on_resume_takes_the_later_value(trial: Storage, tmp_path: Path) -> None:
    """``train.steps=10000 train.steps=3`` means 3, as load_config reads it: when 3 is the recorded value,
    the resume is no change at all (the earlier 10000 must not slip through as an override)."""
    settle_config(trial, _cfg("train.steps=3"), state="new", overrides=[])
    _trained_to(trial, 3, tmp_path)
    resumed = settle_config(
        trial, _cfg(), state="trained", overrides=["trial=t1", "train.steps=10000", "train.steps=3"]
    )
    assert resumed.cfg.train.steps == 3
    assert resumed.overrides == []


def test_the_warm_start_source_cannot_change_on_resume(trial: Storage, tmp_path: Path) -> None:
    settle_config(trial, _cfg(), state="new", overrides=[])
    with pytest.raises(ResumeOverrideError, match="train.warm_start_from.trial"):
        settle_config(trial, _cfg(), state="unfinished", overrides=["train.warm_start_from.trial=other"])
