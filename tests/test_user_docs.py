"""The user-facing pages (README.md, docs/*.md) name no issue numbers, commit hashes or "this morning":
history lives in docs/benchmarks.md with dates and commands, not with the project's bookkeeping."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOKKEEPING = re.compile(r"\bissues? \d+|\bcommit [0-9a-f]{7,}\b|\b(?:this|that) morning\b", re.IGNORECASE)


def test_user_pages_name_no_issue_commit_or_morning() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for n, line in enumerate(page.read_text().splitlines(), 1)
        for m in BOOKKEEPING.finditer(line)
    ]
    assert found == [], "\n".join(found)


def test_the_readme_stays_short_and_links_what_it_promises() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    for link in re.findall(r"\]\(((?:docs/|notebooks/|LICENSE)[^)#]*)", text):
        assert (ROOT / link).exists(), link
