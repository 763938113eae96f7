"""``RoleClock`` and ``Timeline`` under the name the flows and tasks import them by.

What it is: a re-export of ``rollflow.clock.roles``, which lives below ``rollflow.inference`` (the
checkpoint watcher keeps a clock, and this package reads the inference servers' meters).
What it is not: a second clock; new code imports ``rollflow.clock.roles``.
"""

from __future__ import annotations

from rollflow.clock.roles import ROLE_STATES, RoleClock, Timeline, UnknownStateError

__all__ = ["ROLE_STATES", "RoleClock", "Timeline", "UnknownStateError"]
