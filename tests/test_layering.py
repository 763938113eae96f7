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
* Inside ``rollflow/`` the subpackages sit on the floors of ``ROLLFLOW_FLOORS`` (bottom to top): each imports
  only from lower floors, so rollflow's packages form no import circle.
* ``tasks/`` and ``flows/`` are a thin Prefect layer: they define no classes but the Prefect glue listed
  in ``PREFECT_GLUE`` (each with why it is glue); anything else belongs in the core.
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


# The only classes tasks/ and flows/ may define: Prefect glue, each with why it cannot live in the core.
PREFECT_GLUE = {
    "tasks/progress.py:_ClearBarFirst": "a filter on Prefect's console handlers (clears the progress bar)",
    "tasks/progress.py:RunProgress": "the run's progress lines and its Prefect progress artifact",
    "tasks/runtime.py:_RunLogHandler": "forwards the core's log records to the Prefect run's handlers",
    "flows/console.py:_NoCompletedTaskLines": "a filter on Prefect's console lines",
    "flows/end_state.py:RealEndStateFilter": "rewrites Prefect's end-state log line of a cancelled run",
    "flows/cli/interrupt.py:_NoInterruptOnConsole": "a filter on Prefect's console lines after Ctrl-C",
    "flows/gpu_plan.py:MissingImageError": "the error of the GPU deployment plan (a Prefect deployment)",
    "flows/session.py:SessionError": "the error of the Python API that runs the flows",
    "flows/session.py:RLRun": "the Python API: runs the async-rl flow on a private Prefect API",
}


def defined_classes(package: str) -> list[str]:
    """``path:Class`` of every class defined anywhere in ``package`` (nested ones too)."""
    return [
        f"{path.relative_to(ROOT).as_posix()}:{node.name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]


def test_the_prefect_layer_defines_only_glue_classes() -> None:
    found = defined_classes("tasks") + defined_classes("flows")
    assert [c for c in found if c not in PREFECT_GLUE] == []  # move it to the core (rollflow/, infra/)
    assert sorted(set(PREFECT_GLUE) - set(found)) == []  # a stale entry: drop it from the list


# --- import circles ---------------------------------------------------------------------------------------

PACKAGES = ("rollflow", "storage", "infra", "tasks", "flows", "bench")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of this tree it imports (any import that can run, deferred ones too: a
    function-level import is still a dependency, only a cheaper one)."""
    files = {_module_of(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        targets = set()
        for _, name in imported_modules(path.read_text()):
            while name and name not in files:  # `from a.b import c` names module a.b (or package a)
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):  # a package's own __init__
                targets.add(name)
        graph[mod] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert circles(import_graph()) == []  # break it: move what both need below both


def test_the_circle_finder_sees_deferred_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from bench.rollout import tiny_model\n"
    assert [m for _, m in imported_modules(source)] == ["bench.rollout"]


# --- rollflow's floors ------------------------------------------------------------------------------------

# rollflow's subpackages (and its top-level modules), bottom to top (docs/architecture.md, "Layers"): a unit
# imports only units on lower floors, never one on its own floor or above. A new subpackage needs a floor.
ROLLFLOW_FLOORS: tuple[tuple[str, ...], ...] = (
    ("api",),  # the contracts, and the rules every floor shares (loopback, staleness)
    ("clock", "rewards"),  # each role's wall time; reward functions and their runners
    ("inference",),  # clients, engines, the checkpoint watcher (which keeps a clock)
    ("agents", "timing"),  # the agent's endpoint and recorder; the reporter that meters the servers
    ("data",),  # datasets and task families (tool_lookup renders agent conversations)
    ("configuration", "models"),  # the loader (which checks data settings); the tiny model's warm start
    ("workflows", "eval_scores"),  # rollout workflows; evaluation records
    # the rollout worker; the trial room's records (rollflow/trial/: its name, storage, record, evaluation
    # records, base split, choice, resume policy, auto-resume budget, lineage tags)
    ("rollout", "trial.naming", "trial.store", "trial.evaluations", "trial.base_split", "trial.auto_resume"),
    ("trial.record", "trial.choice", "trial.lineage"),
    ("trial.resume_policy",),  # fmt: skip
    ("training", "evaluation", "viewer"),  # the trainer; held-out evaluation; the trajectory viewer
    ("tracking",),  # MLflow and the registry gate, over all of the above
    # the trial room's life, over the trainer and MLflow: finalization, the summary, a retrain from the
    # registry, the Ctrl-C lines; then open_trial; then the command line's check and the package
    ("trial.finalization", "trial.summary", "trial.retrain", "trial.kept"),
    ("trial.opening",),
    ("trial.preflight", "trial"),
)


def rollflow_unit(module: str) -> str | None:
    """``rollflow.rollout.loop`` -> ``rollout``; ``rollflow.eval_scores`` -> ``eval_scores``; else None.
    The trial room's modules are units of their own (``rollflow.trial.record`` -> ``trial.record``): the
    room holds both the trial's records, below the trainer, and its finalization, above MLflow."""
    parts = module.split(".")
    if parts[0] != "rollflow" or len(parts) < 2:
        return None
    return f"trial.{parts[2]}" if parts[1] == "trial" and len(parts) > 2 else parts[1]


def unit_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """``(unit, unit it imports)`` -> one ``module -> module`` import that makes the edge."""
    edges: dict[tuple[str, str], str] = {}
    for mod, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = rollflow_unit(mod), rollflow_unit(target)
            if a is not None and b is not None and a != b:
                edges.setdefault((a, b), f"{mod} -> {target}")
    return edges


def test_rollflow_subpackages_form_no_circle() -> None:
    edges = unit_edges(import_graph())
    units: dict[str, set[str]] = {}
    for a, b in edges:
        units.setdefault(a, set()).add(b)
    assert circles(units) == []  # move what both need below both (a floor of ROLLFLOW_FLOORS)


def test_rollflow_subpackages_import_only_lower_floors() -> None:
    floor = {unit: i for i, units in enumerate(ROLLFLOW_FLOORS) for unit in units}
    present = {rollflow_unit(m) for m in import_graph()} - {None}
    assert sorted(present - set(floor)) == []  # a new subpackage: give it a floor in ROLLFLOW_FLOORS
    assert sorted(set(floor) - present) == []  # a stale entry: drop it
    upward = [
        f"{a} (floor {floor[a]}) imports {b} (floor {floor[b]}): {witness}"
        for (a, b), witness in unit_edges(import_graph()).items()
        if floor[b] >= floor[a]
    ]
    assert upward == []  # move the module to the floor it belongs on, or what it needs below it


def test_the_floor_check_names_units() -> None:
    graph = {
        "rollflow.a.x": {"rollflow.b", "storage.fs"},
        "rollflow.b": {"rollflow.a.y"},
        "rollflow.a.y": set(),
    }
    assert unit_edges(graph) == {
        ("a", "b"): "rollflow.a.x -> rollflow.b",
        ("b", "a"): "rollflow.b -> rollflow.a.y",
    }
    assert rollflow_unit("rollflow") is None and rollflow_unit("flows.cli") is None


# --- sizes: a module holds one concept, a Prefect body tells a story -----------------------------------------

MAX_MODULE_LINES = 500
MAX_PREFECT_BODY_LINES = 40


def test_no_module_is_over_500_lines() -> None:
    long = [
        f"{p.relative_to(ROOT).as_posix()}: {n}"
        for pkg in ("rollflow", "storage", "flows", "tasks")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []  # it holds two concepts: split it


def _prefect_bodies(package: str) -> list[tuple[str, int]]:
    """(path:function, body lines without its docstring) of every @flow / @task function in ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = {
                (d.func if isinstance(d, ast.Call) else d).id
                for d in node.decorator_list
                if isinstance(d.func if isinstance(d, ast.Call) else d, ast.Name)
            }
            if not names & {"flow", "task"}:
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            n = (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1 if body else 0
            found.append((f"{path.relative_to(ROOT).as_posix()}:{node.name}", n))
    return found


def test_flow_and_task_bodies_read_at_a_glance() -> None:
    bodies = _prefect_bodies("flows") + _prefect_bodies("tasks")
    assert len(bodies) >= 10  # the finder sees them
    assert [
        f"{name}: {n}" for name, n in bodies if n > MAX_PREFECT_BODY_LINES
    ] == []  # move the work to rollflow/
