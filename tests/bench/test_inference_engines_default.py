"""``make bench`` after ``make install``: ``bench.inference`` races vLLM only when its venv is there, and
says how to add it otherwise (bench/inference.py ``default_engines``)."""

from __future__ import annotations

import pytest

from bench.inference import default_engines


def test_without_the_vllm_venv_the_local_engine_runs_alone_and_says_how_to_add_vllm(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("rollflow.inference.vllm.REPO_ROOT", tmp_path)  # a checkout without .venv-vllm
    assert default_engines() == ("local",)
    err = capsys.readouterr().err
    assert "make vllm-venv" in err and "--engine vllm" in err


def test_with_a_vllm_python_both_engines_race(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    py = tmp_path / ".venv-vllm" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    monkeypatch.setattr("rollflow.inference.vllm.REPO_ROOT", tmp_path)
    assert default_engines() == ("local", "vllm")
