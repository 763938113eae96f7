"""One trial, opened four ways (the flow, ``rollflow run``, ``RLRun.train()``, ``rollflow resume``), agrees
on its record (``rollflow.trial.opening.open_trial``, the one entry they all reach).

Cheap on purpose: each way runs for real up to the point where the flow has opened and recorded the
trial (config resolved, preflight for the command line, name, choice, ``record/config.json`` written);
the flow's training part (``flows.async_rl._train_trial``) is replaced by a stop that hands back the
opened trial, so no server starts and nothing trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
YAML = "configs/tiny_cpu.yaml"


class _Opened(Exception):
    """Raised where the flow would start training: carries the trial it opened."""

    def __init__(self, opened) -> None:  # noqa: ANN001
        super().__init__(opened.cfg.trial)
        self.opened = opened


def _stop(opened, children, logger):  # noqa: ANN001, ANN202
    raise _Opened(opened)


def _without_trial(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "trial"}


def test_the_flow_the_cli_rlrun_and_a_resume_open_a_trial_alike(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flows.async_rl
    from flows.cli import main
    from flows.session import RLRun
    from rollflow.configuration.loader import load_config, to_dict
    from rollflow.trial.record import read_config_record
    from rollflow.trial.store import open_trial_storage

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(flows.async_rl, "_train_trial", _stop)
    where = [f"storage.root={tmp_path / 'storage'}", "tracking.enabled=false", "train.steps=7"]
    opened = {}
    with pytest.raises(_Opened) as via_flow:
        flows.async_rl.async_rl(config=YAML, overrides=where, trial="via-flow")
    opened["flow"] = via_flow.value.opened
    with pytest.raises(_Opened) as via_cli:
        main(["run", "--config", YAML, "--trial", "via-cli", *where])
    opened["cli"] = via_cli.value.opened
    with pytest.raises(_Opened) as via_rlrun:
        RLRun(config=load_config(YAML, where), trial="via-rlrun").train()
    opened["rlrun"] = via_rlrun.value.opened
    with pytest.raises(_Opened) as via_resume:
        main(["resume", "via-flow", "--config", YAML, *where])
    opened["resume"] = via_resume.value.opened

    assert {k: o.state for k, o in opened.items()} == {
        "flow": "new", "cli": "new", "rlrun": "new", "resume": "unfinished"
    }  # fmt: skip
    records = {k: read_config_record(open_trial_storage(o.cfg)) for k, o in opened.items()}
    assert records["resume"]["resumes"][-1]["overrides"] == []  # the same settings: nothing changed
    configs = {k: _without_trial(r["config"]) for k, r in records.items()}
    assert configs["flow"]["train"]["steps"] == 7 and configs["flow"]["tracking"]["enabled"] is False
    assert configs["cli"] == configs["flow"] and configs["rlrun"] == configs["flow"]
    assert configs["resume"] == configs["flow"]
    # what each run would train with is what it recorded
    assert all(
        _without_trial(to_dict(o.cfg)) == _without_trial(to_dict(opened["flow"].cfg)) for o in opened.values()
    )
