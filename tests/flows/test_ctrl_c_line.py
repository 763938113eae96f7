"""The line Ctrl-C prints (rollflow/trial/kept.py, flows/cli/interrupt.py): the trial kept, its resume point, the resume command.

The real Ctrl-C of a running flow is tests/flows/test_interrupt.py; these check the pieces by hand.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from flows.cli.interrupt import _NoInterruptOnConsole
from rollflow.trial.kept import kept_line, resume_command, trial_for_command
from storage.fs import Storage

CONFIG = "configs/tiny_cpu.yaml"
ROOT = Path(__file__).resolve().parents[2]


def test_the_trial_of_a_command_is_named_before_the_flow_starts(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert re.fullmatch(r"demo-\d{8}-\d{6}-[0-9a-f]{4}", trial_for_command(CONFIG, [], None))
    assert trial_for_command(CONFIG, ["trial=mine"], None) == "mine"
    assert trial_for_command(CONFIG, [], "given") == "given"


def test_the_line_names_what_was_kept_and_how_to_resume(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    public = [f"storage.root={tmp_path}", "train.steps=50"]
    storage = Storage.open(str(tmp_path), "tiny-arith", "t1")
    line = kept_line("t1", CONFIG, public, shown=public)
    assert "kept trial t1 (no resume point yet: training restarts at 0)" in line, line
    storage.put_json("trainer/state-00000006.json", {"version": 6})
    storage.put_json("checkpoints/LATEST", {"version": 7, "path": "x"})
    line = kept_line("t1", CONFIG, [*public, "inference.api_key=hush"], shown=public)
    assert line == (
        "rollflow: stopped by Ctrl-C; kept trial t1 (resume point at version 6; checkpoints up to v7). "
        f"Resume it with: rollflow resume t1 --config {CONFIG} storage.root={tmp_path} train.steps=50"
    )
    assert resume_command("t1", CONFIG, ["trial=t1", "a.b=x y"]) == (
        f"rollflow resume t1 --config {CONFIG} 'a.b=x y'"
    )


def test_the_console_drops_records_about_the_interrupt() -> None:
    quiet = _NoInterruptOnConsole()

    def record(msg: str, exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord("prefect.engine", logging.ERROR, __file__, 1, msg, None, info)

    assert not quiet.filter(record("Engine execution interrupted by base exception", KeyboardInterrupt()))
    assert not quiet.filter(record("Crash detected! ... KeyboardInterrupt", None))
    assert quiet.filter(record("training done at version 3", None))
    assert quiet.filter(record("failed", ValueError("x")))


def test_the_printed_resume_command_parses_as_printed(tmp_path: Path, monkeypatch) -> None:
    """The CLI takes the line's words exactly: the trial, --config, then the dotted overrides after it."""
    import shlex

    import flows.cli.app as cli

    monkeypatch.chdir(ROOT)
    seen = {}
    monkeypatch.setattr(cli, "_dispatch", lambda args: seen.update(vars(args)) or 0)
    public = [f"storage.root={tmp_path}", "train.steps=40"]
    words = shlex.split(kept_line("t1", CONFIG, public, shown=public).split("Resume it with: ", 1)[1])
    assert words[:2] == ["rollflow", "resume"]
    assert cli._main(words[1:]) == 0
    assert seen["command"] == "resume" and seen["trial"] == "t1" and seen["overrides"] == public
