"""The trainer's contracts: the hooks called around each training step.

What it is: ``TrainerHooks``, a two-method Protocol the ``Trainer`` (``rollflow.training.trainer``) calls
once a step's batch is in hand: ``before_step(version)`` before the optimizer step and
``after_step(version)`` after it (``version`` = training steps applied at that moment). The synchronous
baseline (``rollout.pause_during_training``) pauses the inference servers there
(``infra.control.PauseServersHooks``); a benchmark clocks steps or snapshots weights there.

What it is not: the trainer, or anything heavy: this module imports only the standard library.
"""

from __future__ import annotations

from typing import Protocol


class TrainerHooks(Protocol):
    """Called around each step once its batch is in hand (the synchronous baseline pauses rollout here)."""

    def before_step(self, version: int) -> None: ...

    def after_step(self, version: int) -> None: ...
