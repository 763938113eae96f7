"""AgentCounts: what the agent endpoint and workflow saw, as counters the rollout loop logs.

What it is: plain counters, touched only on the rollout's event loop, and ``as_metrics`` (logged as
``rollout/agent_*`` and ``rollout/reward_*`` by the rollout loop, through ``AgentWorkflow.metrics()``). Episode drops are counted by reason:

    agent_error   the agent raised             timeout      it ran past episode_timeout_s
    max_turns     a call past max_turns        token_budget a call past max_episode_tokens
    stale         its oldest token too old     no_calls     it never called the model
    no_reward     returned None, no reward_fn  bad_reward   returned a non-number, NaN, inf or |r| > 1e6
    aborted       the client gave up (shutdown) reward_infra no reward worker could score it

What it is not: no logging and no decisions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

DROP_REASONS: tuple[str, ...] = (
    "agent_error", "timeout", "max_turns", "token_budget", "stale", "no_calls", "no_reward", "bad_reward",
    "aborted", "reward_infra",
)  # fmt: skip


@dataclass
class AgentCounts:
    episodes: int = 0
    episodes_kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    calls_invalid: int = 0  # 400: a request the endpoint cannot serve (AgentRequestError)
    calls_refused_unknown_key: int = 0  # 401: no open episode has this key
    calls_refused_foreign_key: int = 0  # 401: the key of another episode than the URL's
    calls_after_close: int = 0  # 410: the episode already ended (timed out, finished)
    calls_engine_error: int = 0  # 5xx: the inference client failed
    segments_new: int = 0  # calls that started a segment after the first
    tool_calls: int = 0
    tool_call_parse_errors: int = 0
    reward_scored: int = 0
    reward_errors: int = 0
    reward_timeouts: int = 0

    @property
    def scored(self) -> int:
        """Rewards scored by ``reward_fn`` (``RewardCounts``' name, read by the rollout loop's reward check)."""
        return self.reward_scored

    @property
    def errors(self) -> int:
        """Of those, the ones that raised or returned a bad value (``RewardCounts``' name)."""
        return self.reward_errors

    def as_metrics(self) -> dict[str, float]:
        out = {
            "agent_episodes": self.episodes,
            "agent_episodes_kept": self.episodes_kept,
            "agent_calls": self.calls,
            "agent_calls_invalid": self.calls_invalid,
            "agent_calls_refused_unknown_key": self.calls_refused_unknown_key,
            "agent_calls_refused_foreign_key": self.calls_refused_foreign_key,
            "agent_calls_after_close": self.calls_after_close,
            "agent_calls_engine_error": self.calls_engine_error,
            "agent_segments_new": self.segments_new,
            "agent_tool_calls": self.tool_calls,
            "agent_tool_call_parse_errors": self.tool_call_parse_errors,
            "reward_scored": self.reward_scored,
            "reward_errors": self.reward_errors,
            "reward_timeouts": self.reward_timeouts,
        }
        out.update({f"agent_dropped_{r}": self.dropped[r] for r in DROP_REASONS})
        return {k: float(v) for k, v in out.items()}
