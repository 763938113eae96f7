"""Workflow resolution: an instance, a class with kwargs, or an import string; bad strings say what failed."""

from __future__ import annotations

from typing import Any

import pytest

from rollflow.api.errors import WorkflowImportError
from rollflow.api.workflow import RolloutWorkflow, import_string, resolve_workflow
from storage.schema import TrajectoryGroup


class EchoWorkflow(RolloutWorkflow):
    def __init__(self, greeting: str = "hi", **extra: Any) -> None:
        self.greeting, self.extra = greeting, extra

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        return None


def test_instance_is_returned_as_is() -> None:
    wf = EchoWorkflow()
    assert resolve_workflow(wf) is wf


def test_instance_with_kwargs_is_an_error() -> None:
    with pytest.raises(TypeError, match="already-built"):
        resolve_workflow(EchoWorkflow(), greeting="x")


def test_class_is_built_with_kwargs() -> None:
    wf = resolve_workflow(EchoWorkflow, greeting="hello", turns=2)
    assert isinstance(wf, EchoWorkflow) and wf.greeting == "hello" and wf.extra == {"turns": 2}


@pytest.mark.parametrize(
    "spec", ["rollflow.workflows.rlvr:RLVRWorkflow", "rollflow.workflows.rlvr.RLVRWorkflow"]
)
def test_import_string_colon_or_dotted(spec: str) -> None:
    from rollflow.workflows.rlvr import RLVRWorkflow

    assert import_string(spec) is RLVRWorkflow


def test_import_string_builds_the_shipped_workflows() -> None:
    from rollflow.workflows import MultiTurnWorkflow

    class Tok:  # the workflows only touch the tokenizer per episode
        chat_template = "x"

    class Runner:
        async def ascore(self, *a: Any, **k: Any) -> Any: ...

    wf = resolve_workflow(
        "rollflow.workflows.multi_turn:MultiTurnWorkflow",
        reward_fn="builtins:len",
        tokenizer=Tok(),
        group_size=4,
        reward_runner=Runner(),
        max_turns=3,
    )
    assert isinstance(wf, MultiTurnWorkflow) and wf.max_turns == 3 and wf.group_size == 4
    assert wf.reward_fn is len


def test_nested_attribute_path() -> None:
    assert import_string("rollflow.api.workflow:RolloutWorkflow.arun_episode") is RolloutWorkflow.arun_episode


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("rollflow.no_such_module:Thing", "cannot import module 'rollflow.no_such_module'"),
        ("rollflow.workflows.rlvr:NoSuchWorkflow", "has no attribute 'NoSuchWorkflow'"),
        ("justaname", "is not an import string"),
        (":Name", "is not an import string"),
        ("rollflow.api.errors:RollflowError", "not a RolloutWorkflow subclass"),
        ("rollflow.workflows.blocks:merge_samples", "not a RolloutWorkflow subclass"),
    ],
)
def test_bad_strings_name_what_could_not_be_resolved(spec: str, fragment: str) -> None:
    with pytest.raises(WorkflowImportError) as info:
        resolve_workflow(spec)
    assert fragment in str(info.value)
    assert isinstance(info.value, ImportError)  # callers may catch it as an ImportError


def test_a_module_that_fails_on_import_reports_its_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_wf_mod.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkflowImportError, match="not_installed_dependency_xyz"):
        resolve_workflow("broken_wf_mod:Workflow")
