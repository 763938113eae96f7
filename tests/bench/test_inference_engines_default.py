"""``make bench`` after ``make install``: ``bench.inference`` races vLLM and SGLang only when their venvs are
there, and says how to add them otherwise (bench/inference.py ``default_engines``)."""

from __future__ import annotations

import pytest

from bench.inference import default_engines


def test_without_the_engine_venvs_the_local_engine_runs_alone_and_says_how_to_add_them(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("rollflow.inference.vllm.REPO_ROOT", tmp_path)  # a checkout without either venv
    assert default_engines() == ("local",)
    err = capsys.readouterr().err
    assert "make vllm-venv" in err and "make sglang-venv" in err


def test_with_their_pythons_all_engines_race(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for venv in (".venv-vllm", ".venv-sglang"):
        py = tmp_path / venv / "bin" / "python"
        py.parent.mkdir(parents=True)
        py.write_text("")
    monkeypatch.setattr("rollflow.inference.vllm.REPO_ROOT", tmp_path)
    assert default_engines() == ("local", "vllm", "sglang")
