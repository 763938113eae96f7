"""The import rules of docs/architecture.md, checked on every module's syntax tree (no imports run).

Rules (an import anywhere in a module counts, inside functions too; only ``if TYPE_CHECKING:`` blocks
are exempt, because they never run):

* ``storage/`` is the bottom layer: it imports nothing of ours (rollflow, infra, tasks, flows).
* ``rollflow/`` imports neither infra, tasks nor flows (layers point one way).
* ``rollflow/`` and ``storage/`` never import prefect: the core runs and tests without it.
* ``rollflow/api/`` is light: no torch, pyarrow, storage, transformers, numpy, datasets, fsspec,
  mlflow, prefect or yaml, so a newcomer (or a reward worker process) can import the contracts cheaply;
  and it is only contracts: of ours it imports ``rollflow.api`` alone (the loader, redaction and the
  rest of the machinery live in ``rollflow/configuration/`` and the modules that implement them).
* Inside ``rollflow/`` only ``rollflow/tracking/`` imports mlflow; the loops see a ``MetricsSink``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module name) of every import in ``source`` that can run, in source order."""
    tree = ast.parse(source)
    skipped: set[int] = set()  # ids of nodes under ``if TYPE_CHECKING:`` (never executed)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    imports: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            imports += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports.append((node.lineno, node.module))
    yield from sorted(imports)


def violations(package: str, forbidden: tuple[str, ...], *, exempt: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(exempt):
            continue
        for line, module in imported_modules(path.read_text()):
            if module.split(".")[0] in forbidden or module in forbidden:
                found.append(f"{rel}:{line} imports {module}")
    return found


RULES = [
    ("storage", ("rollflow", "infra", "tasks", "flows", "prefect"), ()),
    ("rollflow", ("infra", "tasks", "flows", "prefect"), ()),
    (
        "rollflow/api",
        (
            "torch",
            "pyarrow",
            "storage",
            "transformers",
            "numpy",
            "datasets",
            "fsspec",
            "mlflow",
            "prefect",
            "yaml",
        ),
        (),
    ),
    ("rollflow", ("mlflow",), ("rollflow/tracking/",)),
]


@pytest.mark.parametrize(("package", "forbidden", "exempt"), RULES, ids=[f"{r[0]}-{r[1][0]}" for r in RULES])
def test_imports_point_one_way(package: str, forbidden: tuple[str, ...], exempt: tuple[str, ...]) -> None:
    assert violations(package, forbidden, exempt=exempt) == []


def test_the_contracts_import_only_contracts() -> None:
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in sorted((ROOT / "rollflow" / "api").rglob("*.py"))
        for line, module in imported_modules(path.read_text())
        if module.split(".")[0] == "rollflow" and not module.startswith("rollflow.api")
    ]
    assert found == []


def test_the_checker_sees_nested_imports_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "if TYPE_CHECKING:\n"
        "    from storage.schema import TrajectoryGroup\n"
        "else:\n"
        "    import pyarrow\n"
        "def f():\n"
        "    try:\n"
        "        from prefect import flow\n"
        "    except ImportError:\n"
        "        import mlflow.entities\n"
        "class C:\n"
        "    def g(self):\n"
        "        with open('x'):\n"
        "            import storage.fs\n"
    )
    assert [m for _, m in imported_modules(source)] == [
        "typing", "torch", "pyarrow", "prefect", "mlflow.entities", "storage.fs",
    ]  # fmt: skip
