"""docs/malformed-inputs.md stays true: every row names tests that exist, and the table keeps its size."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "malformed-inputs.md"


def _rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("| ") and not line.startswith(("| Area", "| ---")):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_row_names_tests_that_exist() -> None:
    rows = _rows()
    stated = re.search(r"^(\d+) rows\.$", DOC.read_text(), re.M)
    assert stated and int(stated.group(1)) == len(rows), (
        f"the doc says {stated and stated.group(1)} rows, has {len(rows)}"
    )
    assert len(rows) >= 35, f"the table should cover at least 35 malformed inputs, has {len(rows)}"
    for area, inp, _, tests in rows:
        refs = re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", tests)
        assert refs, f"row {area} / {inp[:60]!r} names no test"
        for path, name in refs:
            file = ROOT / path
            assert file.is_file(), f"{path} (row {inp[:60]!r}) does not exist"
            assert name in _test_names(file), f"{path}::{name} (row {inp[:60]!r}) does not exist"
