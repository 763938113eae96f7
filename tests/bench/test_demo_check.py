"""bench.demo_check: CI's reading of a `make demo` log (the summary, and whether accuracy rose)."""

from __future__ import annotations

from pathlib import Path

from bench.demo_check import main, read_summary

SUMMARY = "12:00:01 | INFO | noise eval_accuracy_before 0.9\n\ntrial t\neval_accuracy_before {b}\neval_accuracy_after {a}\n"


def test_reads_the_printed_summary_not_log_noise() -> None:
    assert read_summary(SUMMARY.format(b="0.210", a="0.990")) == {
        "eval_accuracy_before": 0.21,
        "eval_accuracy_after": 0.99,
    }


def test_exit_code_says_whether_the_demo_finished_and_learned(tmp_path: Path, capsys) -> None:
    log = tmp_path / "demo.log"
    log.write_text(SUMMARY.format(b="0.210", a="0.990"))
    assert main([str(log)]) == 0
    assert "demo_acc_gain 0.780" in capsys.readouterr().out
    log.write_text(SUMMARY.format(b="0.500", a="0.500"))
    assert main([str(log)]) == 1
    assert "did not rise" in capsys.readouterr().out
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert main([str(log)]) == 1
    assert "did not finish" in capsys.readouterr().out
