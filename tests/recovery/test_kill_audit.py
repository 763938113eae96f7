"""A real tiny run (``python -m flows.async_rl``) stopped twice by SIGTERM at random moments and resumed
each time (graceful stops: in-flight episodes are kept as partial records and continued): storage
accounts for every prompt position handed out, every block open at a stop is taken over by a later
life, nothing is trained twice, and the trial ends with its final checkpoint committed and finalized
(``bench.kill_audit``; 1.5-2.5 minutes on 2 cores).

The second SIGTERM has a short grace (0.3 s, then SIGKILL, as a preemption whose notice runs out):
wherever in the graceful stop the SIGKILL lands, storage stays whole and accounted for. The partial
record is one put, whole or absent (absent: its episodes are regenerated, as after a SIGKILL), and
every record a later life finds is whole. Measured: the partial commit took 0.11 s
(``partial_commit_s``, 16 episodes), inside the grace; the SIGKILL cut the flow's shutdown after it.

How the audit fails on damaged storage is ``test_prompt_accounting.py``. SIGKILL + the same audit runs
in ``test_auto_resume.py`` (a deployment that resumes itself), and ``python -m bench.kill_audit`` runs
either kind as many times as asked; CI runs the SIGTERM kind only, to keep its time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kill_audit import run_kill_audit
from storage import keys
from storage.fs import Storage
from storage.partial_records import PARTIALS_FORMAT

pytestmark = pytest.mark.slow

SHORT_GRACE_S = 0.3  # the flow's graceful stop takes ~1-3 s here: the grace runs out in its middle


@pytest.mark.parametrize("sigterm", [True], ids=["sigterm"])
def test_two_stops_leave_every_prompt_accounted_for(tmp_path: Path, sigterm: bool) -> None:
    lines: list[str] = []
    figures, audit, lives = run_kill_audit(
        kills=2, sigterm=sigterm, steps=30, window_s=4.0, seed=1, workdir=tmp_path, say=lines.append,
        graces=(120.0, SHORT_GRACE_S),
    )  # fmt: skip
    report = "\n".join([*lines, *(f"{k} {v}" for k, v in figures.items()), *audit.problems])
    assert figures["kills"] == 2, report  # both stops landed before the run finished
    assert audit.positions_handed_out > 0 and audit.positions_committed > 0, report
    assert audit.positions_unaccounted == 0 and audit.positions_generated_twice == 0, report
    assert figures["blocks_not_adopted_after_stops"] == 0, report
    assert audit.groups_trained_twice == 0 and audit.groups_trained_not_committed == 0, report
    assert audit.final_committed and audit.final_version == 30, report
    assert audit.ok, report
    assert figures["orphans_left"] == 0, report
    assert lives[-1].rc == 0, report
    if sigterm:  # a graceful stop: the process exits on its own, well before the driver's 120 s SIGKILL
        assert lives[0].stopped_by == "SIGTERM" and lives[0].exit_s is not None, report
        assert lives[0].exit_s < 60, report
        assert "partial_commit_s" in (tmp_path / "life-0.log").read_text(), report  # it kept its partials
        # the short grace ran out: SIGKILLed inside its graceful stop, yet all is accounted for (above)
        assert lives[1].stopped_by == "SIGTERM+SIGKILL", report
        logs = "".join((tmp_path / f"life-{x.index}.log").read_text(errors="replace") for x in lives)
        assert "unreadable, skipped" not in logs and "unknown format" not in logs, report
        storage = Storage.open(str(tmp_path / "storage"), "tiny-arith", "kill-audit-1", {})
        for key in storage.list(keys.PARTIALS_DIR):  # what is left is whole
            assert storage.get_json(key).get("format") == PARTIALS_FORMAT, key
    print(report)
