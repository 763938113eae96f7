"""One role's wall time in named states (``RoleClock``) and the roles of one process (``Timeline``).

A role is in exactly one state at any moment; ``enter(state)`` closes the running span and opens the next,
so the states' totals add up to the role's wall time since it started:

    sum_s total(role, s) = t_now - t_start(role)        frac(role, s) = total(role, s) / (t_now - t_start)

The states each role uses (``ROLE_STATES``):

- ``trainer``: ``waiting_data`` (the batch is not there yet: waiting for rollouts, plus reading and padding
  the shards once they are), ``computing`` (advantages, proximal/reference logprobs, PPO update),
  ``publishing`` (the audit record, the checkpoint hand-off and the resume point), ``other`` (set-up and
  hooks, e.g. the synchronous baseline's pause of the servers);
- ``rollout``: ``generating`` (episodes in flight, their reward scoring included), ``flush_wait`` (none
  in flight; accepted groups wait in the shard writer's buffer), ``capacity_wait`` (none in flight because
  the staleness bound holds new ones back: waiting for the trainer's next version), ``claim_wait`` (the
  claim gate over every worker's prompts refused the next block), ``paused`` (a weight load has the servers
  paused), ``exhausted`` (every allowed epoch handed out), ``idle`` (none of those: start-up, the tick
  between an episode's end and the next start); ``rollflow.rollout.worker_report.rollout_state`` decides;
- ``weights`` (the checkpoint watcher): ``fetching`` (fetch and verify a new version; generation goes on),
  ``updating`` (the round trips around a load: the served-version check, the pause request),
  ``loading`` (from a server's pause to its continue: generation stops there) or ``waiting``;
- ``eval``: ``evaluating`` or ``idle``.

Every span is kept (adjacent spans of one state merge) up to ``max_spans`` per role; past that only the
totals grow and the document says ``truncated``. ``Timeline.document()`` is what the run stores as the
``timeline.json`` artifact and what ``rollflow.timing.plot`` draws.

What it is not: thread-safe against two threads driving one role (each role has one owner thread; other
threads only read), nor persistent (a resumed run starts a new timeline).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

ROLE_STATES: dict[str, tuple[str, ...]] = {
    "trainer": ("waiting_data", "computing", "publishing", "other"),
    "rollout": ("generating", "flush_wait", "capacity_wait", "claim_wait", "paused", "exhausted", "idle"),
    "weights": ("fetching", "updating", "loading", "waiting"),
    "eval": ("evaluating", "idle"),
}
DOC_FORMAT = 1


class UnknownStateError(ValueError):
    """A role was asked to enter a state it does not declare."""


class RoleClock:
    """Wall time of one role split into named states (see the module docstring)."""

    def __init__(
        self,
        role: str,
        states: Sequence[str],
        *,
        initial: str,
        origin: float,
        clock: Callable[[], float] = time.monotonic,
        max_spans: int = 50_000,
    ) -> None:
        if initial not in states:
            raise UnknownStateError(f"role {role!r}: initial state {initial!r} is not one of {list(states)}")
        self.role = role
        self.states = tuple(states)
        self._clock = clock
        self._origin = origin
        self._lock = threading.Lock()
        self._max_spans = max_spans
        self._totals = dict.fromkeys(self.states, 0.0)
        self._state = initial
        self._since = clock()
        self._start = self._since
        self._spans: list[list[Any]] = [
            [self._since - origin, None, initial]
        ]  # [t0, t1, state], t1 None: open
        self.truncated = False

    @property
    def state(self) -> str:
        return self._state

    def enter(self, state: str) -> str:
        """Switch to ``state``; return the state it leaves."""
        if state not in self._totals:
            raise UnknownStateError(
                f"role {self.role!r} has no state {state!r} (states: {list(self.states)})"
            )
        now = self._clock()
        with self._lock:
            prev = self._state
            if state == prev:
                return prev
            self._totals[prev] += now - self._since
            self._state, self._since = state, now
            t = now - self._origin
            self._spans[-1][1] = t
            if len(self._spans) < self._max_spans:
                self._spans.append([t, None, state])
            else:
                self.truncated = True
            return prev

    @contextlib.contextmanager
    def during(self, state: str) -> Iterator[None]:
        """``state`` for the body, then back to the state before it."""
        prev = self.enter(state)
        try:
            yield
        finally:
            self.enter(prev)

    def totals(self) -> dict[str, float]:
        """Seconds in each state so far (the open span included)."""
        now = self._clock()
        with self._lock:
            out = dict(self._totals)
            out[self._state] += now - self._since
        return out

    def fractions(self) -> dict[str, float]:
        """Each state's share of the role's wall time so far (they sum to 1)."""
        totals = self.totals()
        wall = sum(totals.values())
        return {s: (v / wall if wall > 0 else 0.0) for s, v in totals.items()}

    def wall_s(self) -> float:
        return self._clock() - self._start

    def spans(self) -> list[tuple[float, float, str]]:
        """``(t0, t1, state)`` in seconds since the timeline's origin; the open span ends now."""
        now = self._clock() - self._origin
        with self._lock:
            return [(t0, now if t1 is None else t1, s) for t0, t1, s in self._spans if t1 is None or t1 > t0]


class Timeline:
    """The roles of one process on one clock, and the policy versions as they appear."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_spans: int = 50_000) -> None:
        self._clock = clock
        self.origin = clock()
        self.wall_origin = time.time()
        self._max_spans = max_spans
        self._roles: dict[str, RoleClock] = {}
        self._versions: list[tuple[float, int]] = []
        self._samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def role(
        self, name: str, states: Sequence[str] | None = None, *, initial: str | None = None
    ) -> RoleClock:
        """The clock of role ``name`` (made on first use; ``states`` default to ``ROLE_STATES[name]``)."""
        with self._lock:
            found = self._roles.get(name)
            if found is None:
                declared = tuple(states) if states is not None else ROLE_STATES.get(name)
                if not declared:
                    raise UnknownStateError(f"role {name!r} has no declared states; pass states=")
                found = RoleClock(
                    name,
                    declared,
                    initial=initial or declared[-1],
                    origin=self.origin,
                    clock=self._clock,
                    max_spans=self._max_spans,
                )
                self._roles[name] = found
            return found

    def roles(self) -> dict[str, RoleClock]:
        with self._lock:
            return dict(self._roles)

    def now(self) -> float:
        """Seconds since the timeline's origin."""
        return self._clock() - self.origin

    def mark_version(self, version: int) -> None:
        """Policy ``version`` exists from now on (the trainer calls it after each step)."""
        with self._lock:
            if not self._versions or self._versions[-1][1] != version:
                self._versions.append((self._clock() - self.origin, int(version)))

    @property
    def version(self) -> int:
        with self._lock:
            return self._versions[-1][1] if self._versions else 0

    def add_sample(self, sample: dict[str, Any]) -> None:
        """A periodic reading (cores, servers) at ``sample['t']`` seconds since the origin."""
        with self._lock:
            self._samples.append(dict(sample))

    def metrics(self) -> dict[str, float]:
        """``time/{role}/{state}_frac`` and ``time/{role}/wall_s`` for every role so far."""
        out: dict[str, float] = {}
        for name, clock in self.roles().items():
            for state, frac in clock.fractions().items():
                out[f"time/{name}/{state}_frac"] = frac
            out[f"time/{name}/wall_s"] = clock.wall_s()
        return out

    def document(self) -> dict[str, Any]:
        """Everything as one JSON-ready dict (the ``timeline.json`` artifact)."""
        roles = self.roles()
        with self._lock:
            versions = list(self._versions)
            samples = list(self._samples)
        return {
            "format": DOC_FORMAT,
            "wall_origin": self.wall_origin,
            "duration_s": self.now(),
            "roles": {
                name: {
                    "states": list(c.states),
                    "totals_s": c.totals(),
                    "fractions": c.fractions(),
                    "spans": [[round(a, 4), round(b, 4), s] for a, b, s in c.spans()],
                    "truncated": c.truncated,
                }
                for name, c in roles.items()
            },
            "versions": [[round(t, 4), v] for t, v in versions],
            "samples": samples,
        }
