"""A real tiny run (``python -m flows.async_rl``) stopped twice by SIGTERM at random moments and resumed
each time (graceful stops: in-flight episodes are kept as partial records and continued): storage accounts for every prompt position handed out, every block open at a
stop is taken over by a later life, nothing is trained twice, and the trial ends with its final
checkpoint committed and finalized (``bench.kill_audit``; 2-3 minutes each on 2 cores). How the audit
fails on damaged storage is ``test_prompt_accounting.py``. SIGKILL + the same audit runs in
``test_auto_resume.py`` (a deployment that resumes itself), and ``python -m bench.kill_audit`` runs either
kind as many times as asked; CI runs the SIGTERM kind only, to keep its time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kill_audit import run_kill_audit

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sigterm", [True], ids=["sigterm"])
def test_two_stops_leave_every_prompt_accounted_for(tmp_path: Path, sigterm: bool) -> None:
    lines: list[str] = []
    figures, audit, lives = run_kill_audit(
        kills=2, sigterm=sigterm, steps=30, window_s=4.0, seed=1, workdir=tmp_path, say=lines.append
    )
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
        assert all(x.exit_s is not None and x.exit_s < 60 for x in lives[:-1]), report
    print(report)
