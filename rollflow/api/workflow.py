"""The rollout workflow contract and how workflows are named in config.

What it is: the lifecycle of a ``RolloutWorkflow``, which every workflow has:

* ``arun_episode(client, data)`` returns one ``TrajectoryGroup`` (all samples for one prompt) or
  ``None`` to reject the episode; many run concurrently on one event loop;
* ``metrics()`` returns the workflow's own counters (cumulative), which the rollout loop logs beside its
  own; default: none;
* ``close()`` releases what the workflow started (reward workers, an endpoint, threads); the rollout
  loop calls it once, after the last episode, when it built the workflow; default: nothing to release.

Plus ``resolve_workflow``, which turns an instance, a class with kwargs, or an import string
``'pkg.module:Name'`` into an instance. How to write a workflow: docs/workflows.md.
What it is not: the executor that schedules episodes (``rollflow.rollout.executor``), nor the building
blocks the shipped workflows are made of (``rollflow.workflows.blocks``).
"""

from __future__ import annotations

import pkgutil
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from rollflow.api.errors import WorkflowImportError
from rollflow.api.inference import InferenceClient

if TYPE_CHECKING:  # the trajectory types live in storage; the contract only names them
    from storage.schema import TrajectoryGroup


class RolloutWorkflow(ABC):
    """One episode per call. Must be safe to run many episodes concurrently on one event loop."""

    @abstractmethod
    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        """Run one episode for the dataset row ``data`` and return its trajectory group, or None."""

    def metrics(self) -> dict[str, float]:
        """Counters since the workflow was built, logged as ``rollout/<name>`` at each metrics tick.

        A workflow that scores with a reward function reports ``reward_scored`` and ``reward_errors``
        (calls scored, and of those the ones that raised or returned a bad value): the rollout loop
        stops a run whose reward function raised on every one of its first calls.
        """
        return {}

    def close(self) -> None:  # noqa: B027 (a no-op default, not an abstract method)
        """Release what the workflow started (reward workers, an endpoint, threads). Called once, after
        the last episode, by whoever built the workflow."""


def import_string(spec: str) -> Any:
    """Resolve ``'pkg.module:Name'`` (or ``'pkg.module.Name'``) to the object it names.

    ``pkgutil.resolve_name`` with errors that say what failed. Light (stdlib only), so a reward worker
    process can use it too.

    Raises:
        WorkflowImportError: not an import string, the module does not import, or no such attribute.
    """
    module_part, colon, attr = spec.partition(":")
    if not module_part or (colon and not attr) or (not colon and "." not in spec):
        raise WorkflowImportError(f"{spec!r} is not an import string; write it as 'pkg.module:Name'")
    try:
        return pkgutil.resolve_name(spec)
    except ValueError:
        raise WorkflowImportError(
            f"{spec!r} is not an import string; write it as 'pkg.module:Name'"
        ) from None
    except ImportError as exc:
        module = getattr(exc, "name", None) or module_part
        raise WorkflowImportError(f"cannot import module {module!r} from {spec!r}: {exc}") from exc
    except AttributeError as exc:
        raise WorkflowImportError(f"{spec!r}: {exc}") from None


def resolve_workflow(spec: RolloutWorkflow | type | str, **kwargs: Any) -> RolloutWorkflow:
    """An instance is returned as is; a class or import string is instantiated with ``kwargs``."""
    if isinstance(spec, RolloutWorkflow):
        if kwargs:
            raise TypeError("kwargs given for an already-built workflow instance")
        return spec
    target = import_string(spec) if isinstance(spec, str) else spec
    if not (isinstance(target, type) and issubclass(target, RolloutWorkflow)):
        raise WorkflowImportError(f"{spec!r} resolves to {target!r}, which is not a RolloutWorkflow subclass")
    return target(**kwargs)
