"""What a reward function must return, and how one is named in config.

What it is. The contract itself, ``reward_fn(prompt, completion, answer, **data) -> float``, is
``rollflow.api.rewards.RewardFn``. It must be importable by the string ``"pkg.module:name"``
(``reward_fn_name``), because the reward runner calls it in worker processes by that name (no pickled
callables). It may raise or hang: the runner turns both into a 0.0 score that is logged and counted.

A reward must be a finite real number with ``|reward| <= MAX_ABS_REWARD`` (1e6). Anything else (a
bool, a string such as ``"1.0"``, NaN, inf, ``1e39``) is refused by ``check_reward``: the call counts
as an error and scores 0.0, like a reward that raises. The bound is a refusal, not a clip: a reward of
``1e39`` is a bug in the reward function, and clipping would train on it silently. Why ``1e6``: shards
store rewards as float32 (max ~3.4e38, so ``1e39`` becomes inf and every step is skipped as
non-finite), and group normalisation squares rewards (``std`` of float32 values overflows at
``|r| ~ 1.8e19``); GRPO normalises each group, so no useful reward needs a larger scale.

What it is not: the runner (``rollflow.rewards.runner``) or any particular reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rollflow.api.errors import WorkflowImportError
from rollflow.api.workflow import import_string

MAX_ABS_REWARD = 1e6


class RewardValueError(ValueError):
    """A reward function returned something that is not a bounded finite number."""


def check_reward(value: object) -> float:
    """``value`` as a float when it is an int/float with ``|value| <= MAX_ABS_REWARD``.

    Raises:
        RewardValueError: a bool, a non-number (``"1.0"``, None), NaN, inf, or ``|value| > 1e6``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardValueError(f"reward function returned {value!r} ({type(value).__name__}), not a float")
    try:
        as_float = float(value)
    except OverflowError:  # an int too large for a float
        as_float = math.inf
    if not math.isfinite(as_float) or abs(as_float) > MAX_ABS_REWARD:
        raise RewardValueError(
            f"reward function returned {value!r}; a reward must be finite with |reward| <= "
            f"{MAX_ABS_REWARD:g} (rescale the reward; GRPO normalises each group anyway)"
        )
    return as_float


def reward_fn_name(fn: Callable[..., float] | str) -> str:
    """The import string ``"pkg.module:qualname"`` of a reward function, checked to resolve back to it.

    Raises:
        WorkflowImportError: a string that does not import, or a callable that cannot be imported by
            name (a lambda, a nested function, a ``functools.partial``, a method of an instance).
    """
    if isinstance(fn, str):
        spec = fn.strip() if ":" in fn else ":".join(fn.strip().rsplit(".", 1))
        target = import_string(spec)
        if not callable(target):
            raise WorkflowImportError(f"reward function {fn!r} resolves to {target!r}, which is not callable")
        return spec
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        # __main__ is a different module in the worker process, so it cannot name the function.
        raise WorkflowImportError(
            f"reward function {fn!r} cannot be imported by name in a worker process; define it at the "
            "top level of an importable module and pass it (or 'pkg.module:name')"
        )
    spec = f"{module}:{qualname}"
    if import_string(spec) is not fn:
        raise WorkflowImportError(f"{spec!r} does not resolve to {fn!r}; pass an importable function")
    return spec
