"""Does a bounded rollout yield enough groups for the trainer? Said once, at rollout start-up.

What it is: ``bounded_supply_warning(cfg, n_rows)``. With ``rollout.max_epochs = E`` the rollout
ends after every one of the ``n_rows`` prompts has been a group ``E`` times, so it can commit at most

    supply = n_rows * E   groups,   while the trainer needs   demand = train.batch_size * train.steps.

If ``supply < train.batch_size`` not even the first step can be filled; if ``supply < demand`` the
trainer runs ``supply // train.batch_size`` steps and then waits. Either way the trainer would sit in
silence until ``train.data_wait_timeout_s`` and then fail; this says so up front, logged at WARNING
by the rollout loop (``rollout.dynamic_sampling`` and failed episodes only lower the supply further).
Example: 3 rows, E = 1, batch 4 -> "at most 3 groups ... one training batch needs 4". With a prompt
curriculum set (``rollout.skip_*_prob``; off by default) every prompt may be
skipped after its first epoch, so the supply counted is ``n_rows * (1 + (E - 1) * (1 - p))`` with ``p``
the larger skip probability.

What it is not: an error. A rollout run on its own (tests, a rollout-only deployment) or a trainer
that is stopped early may want fewer groups; the synthetic task's sizes are checked as config errors
in ``ExperimentConfig`` because they are known before any file is read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollflow.api.config import ExperimentConfig

logger = logging.getLogger(__name__)


def bounded_supply_warning(cfg: ExperimentConfig, n_rows: int) -> str | None:
    """The start-up warning for a bounded rollout too small for the trainer, or None (and log it)."""
    epochs = cfg.rollout.max_epochs
    if epochs is None:
        return None
    supply = n_rows * epochs
    skip = max(cfg.rollout.curriculum_probs())
    how = f"{n_rows} prompts x rollout.max_epochs={epochs}"
    if skip > 0:  # a prompt curriculum may skip every prompt after its first epoch, each with prob. skip
        supply = n_rows + int(n_rows * (epochs - 1) * (1 - skip))
        how += f", of which the prompt curriculum may skip {skip:.0%} after the first epoch"
    batch, steps = cfg.train.batch_size, cfg.train.steps
    fix = (
        "add prompts, raise rollout.max_epochs (or null for no bound), or lower train.batch_size/train.steps"
    )
    if skip > 0:
        fix += (
            "; or set rollout.skip_solved_prob/skip_unsolved_prob to 0 (the prompt curriculum skips prompts)"
        )
    if supply < batch:
        message = (
            f"the bounded rollout yields at most {supply} groups ({how}) but one training batch needs "
            f"{batch} (train.batch_size): the trainer cannot make a "
            f"single step and will fail after train.data_wait_timeout_s={cfg.train.data_wait_timeout_s:g}s; "
            f"{fix}"
        )
    elif supply < batch * steps:
        message = (
            f"the bounded rollout yields at most {supply} groups ({how}), enough for {supply // batch} of "
            f"train.steps={steps} steps of {batch} groups: the "
            f"trainer then waits and fails after train.data_wait_timeout_s="
            f"{cfg.train.data_wait_timeout_s:g}s; {fix}"
        )
    else:
        return None
    logger.warning("%s", message)
    return message
