"""The CLI entry: config errors exit 2, the JSON-lines sink writes one line per log call."""

from __future__ import annotations

import json
from pathlib import Path

from rollflow.training.run import JsonlSink, main


def test_bad_config_exits_2(capsys) -> None:
    assert main(["train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err


def test_jsonl_sink(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "m" / "metrics.jsonl")
    sink.log({"loss": 0.5, "lr": 1}, step=3)
    sink.log({"loss": 0.25}, step=4)
    lines = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 3, "loss": 0.5, "lr": 1.0}, {"step": 4, "loss": 0.25}]
