"""The ``rollflow`` command names a trial one way and finds its config and trials from any directory
(flows/cli/): ``eval TRIAL`` and ``inspect TRIAL`` (the old ``--trial T`` and ``trial=T`` still work and
say so), the demo's config as the default, relative paths in a config relative to the project directory
(``$ROLLFLOW_PROJECT_DIR``, else the current directory), and ``ls``
over every experiment under the storage root. Storage only: no Prefect starts in these tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from flows.cli.paths import CHECKOUT, DEFAULT_CONFIG, config_path
from storage.fs import Storage


@pytest.fixture(autouse=True)
def _no_project_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_PROJECT_DIR", raising=False)


def _put(root: Path, experiment: str, trial: str) -> None:
    storage = Storage.open(str(root), experiment, trial)
    storage.put_json("trainer/DONE.json", {"version": 3})
    storage.put_json("checkpoints/LATEST", {"version": 3, "path": "x"})


def test_the_default_config_is_the_demos_and_is_found_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DEFAULT_CONFIG == "configs/tiny_hard.yaml"  # what `make demo` trains (Makefile DEMO_CONFIG)
    monkeypatch.chdir(CHECKOUT)
    assert config_path(DEFAULT_CONFIG) == (DEFAULT_CONFIG, CHECKOUT)  # run in the checkout, config in it
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's config, the current directory's runs/
    assert config_path(DEFAULT_CONFIG) == (str(CHECKOUT / DEFAULT_CONFIG), tmp_path)


def test_ls_lists_every_experiment_and_config_paths_are_project_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "proj"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "mine.yaml").write_text("experiment: mine\nstorage:\n  root: runs/storage\n")
    _put(project / "runs" / "storage", "tiny-add-gap", "demo-1")
    _put(project / "runs" / "storage", "rlrun-tiny", "py-1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["ls", "--config", str(project / "configs" / "mine.yaml")]) == 0
    out = capsys.readouterr().out  # runs/ is the current directory's, wherever the config is
    assert f"no trial is stored under {elsewhere / 'runs' / 'storage'}" in out, out
    assert f"(runs/storage is resolved in {elsewhere}: run the command in the directory" in out, out
    monkeypatch.setenv("ROLLFLOW_PROJECT_DIR", str(project))
    assert main(["ls", "--config", str(project / "configs" / "mine.yaml")]) == 0
    out = capsys.readouterr().out
    assert "experiment rlrun-tiny" in out and "experiment tiny-add-gap" in out, out
    assert "demo-1" in out and "py-1" in out and "2 trial(s) under" in out
    assert Path.cwd() == elsewhere  # the working directory is put back
    assert main(["ls", "--config", str(project / "configs" / "mine.yaml"), "experiment=rlrun-tiny"]) == 0
    out = capsys.readouterr().out
    assert "py-1" in out and "demo-1" not in out


def test_eval_and_inspect_take_the_trial_after_the_command_and_keep_the_old_spellings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _put(tmp_path, "exp", "t1")
    where = [f"storage.root={tmp_path}", "experiment=exp"]
    assert main(["eval", "t2", *where]) == 2
    err = capsys.readouterr().err
    assert "trial 't2' has no committed checkpoint" in err and "deprecated" not in err
    assert main(["eval", "--trial", "t2", *where]) == 2
    err = capsys.readouterr().err
    assert "`--trial t2` is deprecated; write `rollflow eval t2`" in err and "'t2' has no committed" in err
    assert main(["eval", *where]) == 2
    assert "rollflow eval TRIAL" in capsys.readouterr().err

    assert main(["inspect", "nosuch", *where]) == 2
    err = capsys.readouterr().err
    assert "no such trial: nosuch" in err and "deprecated" not in err
    assert main(["inspect", "trial=nosuch", *where]) == 2
    err = capsys.readouterr().err
    assert "`trial=nosuch` is deprecated; write `rollflow inspect nosuch`" in err and "no such trial" in err


def test_a_trial_under_another_experiment_of_the_root_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Storage.open(str(tmp_path), "rlrun-tiny", "py-1").put_json("trainer/DONE.json", {"version": 3})
    assert main(["eval", "py-1", f"storage.root={tmp_path}"]) == 2  # it holds no checkpoint: said there
    err = capsys.readouterr().err
    assert f"under {tmp_path / 'rlrun-tiny'}" in err, err
