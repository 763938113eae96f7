"""AgentWorkflow: train any agent that speaks the OpenAI API, multi-turn and with tools, from exact tokens.

What it is. A ``RolloutWorkflow`` whose episode is a user's function::

    async def agent(base_url: str, api_key: str, data: dict) -> float | None

called ``group_size`` times concurrently for one dataset row (GRPO's group), each time with the
``base_url`` and api key of a fresh episode of the in-process ``AgentEndpoint``. The agent uses the
official ``openai`` client (or anything built on it) as it would against any provider. Every call is
forwarded to the inference engine and recorded (prompt ids, completion ids, logprobs, per-token
versions). When the agent returns, its episode becomes one trajectory row per segment
(``rollflow.agents.recorder``): ids as the engine saw them, ``loss_mask`` 1 on model tokens only
(tool results, user turns and template text are context), ``versions`` per token.

Reward: the agent's return value (a finite number, ``|r| <= 1e6``), or, when it returns None,
``reward_fn(prompt, completion, answer, transcript=..., **data)`` on the final conversation
(``prompt`` its last user message, ``completion`` the last assistant text), run by the reward runner
like every workflow's.

Bad episodes are dropped, counted by reason (``AgentCounts``) and never trained: the agent raised, ran
past ``episode_timeout_s``, made a call past ``max_turns`` or past ``max_episode_tokens``, never called
the model, returned no usable reward; and, with ``max_staleness`` set, an episode whose oldest model
token is more than ``max_staleness`` versions behind the policy (checked before each call, so a stale
episode stops early, and when it ends). That bound is per episode, so one slow episode does not make
its group stale; the executor still applies its own bound to the group's head version.

A synchronous agent (``def agent(...)``, with ``openai.OpenAI``) runs on a thread of its own pool; a
timed-out thread cannot be killed, so its episode is closed (its later calls get 410) and left to end.

Config::

    rollout:
      workflow: rollflow.workflows.agent:AgentWorkflow
      workflow_kwargs: {agent: my_pkg.my_agent:agent, max_turns: 8, max_episode_tokens: 2048,
                        episode_timeout_s: 120}

``max_staleness`` comes from ``rollout.max_staleness`` (``rollflow.workflows.factory.build_workflow`` passes
it to a workflow that names it); ``workflow_kwargs.max_staleness`` overrides it, ``null`` turns the
per-episode bound off. Held-out evaluation of an agent run calls the agent too, greedy, one episode per
prompt (``rollflow.evaluation.agent``).

What it is not: the endpoint (``rollflow.agents.endpoint``) or the token bookkeeping
(``rollflow.agents.recorder``); docs/agents.md is the user's guide.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from rollflow.agents.counts import AgentCounts
from rollflow.agents.endpoint import AgentEndpoint, EpisodeHandle
from rollflow.agents.recorder import EpisodeLimits, EpisodeRecorder, SegmentPolicy
from rollflow.agents.tool_calls import TOOL_FORMATS, ToolFormat
from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.inference import InferenceClient, SamplingParams
from rollflow.api.rewards import RewardFn, RewardScorer
from rollflow.api.staleness import is_stale, min_trainable_version
from rollflow.api.tokenizer import ChatTokenizer
from rollflow.api.workflow import RolloutWorkflow, import_string
from rollflow.rewards.protocol import RewardValueError, check_reward
from rollflow.workflows.blocks import load_tokenizer, merge_samples, sampling_from
from rollflow.workflows.scoring import (
    close_scorer,
    judge_outcome,
    open_scorer,
    passthrough,
    raise_if_unscored,
)
from storage.schema import TrajectoryGroup, TrajectoryRow

logger = logging.getLogger(__name__)

AgentFn = Callable[[str, str, dict[str, Any]], Any]


class AgentWorkflow(RolloutWorkflow):
    """Run a user's OpenAI-client agent per episode and train on what the engine generated."""

    def __init__(
        self,
        agent: AgentFn | str,
        tokenizer: ChatTokenizer | str,
        sampling: SamplingParams | dict[str, Any] | None = None,
        group_size: int = 4,
        *,
        reward_fn: str | RewardFn | Callable[..., float] | None = None,
        reward_runner: RewardScorer | None = None,
        reward_workers: int = 2,
        reward_timeout_s: float = 10.0,
        max_turns: int = 32,
        max_episode_tokens: int = 8192,
        episode_timeout_s: float = 300.0,
        max_staleness: int | None = None,
        segments: SegmentPolicy = "all",
        tool_format: ToolFormat = "hermes",
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "rollflow-policy",
        sync_agent_threads: int = 64,
    ) -> None:
        """
        Args:
            agent: ``agent(base_url, api_key, data) -> float | None`` (async or not), or its import string.
            tokenizer: the policy's tokenizer (with a chat template) or its directory.
            sampling: sampling parameters of every call; ``max_new_tokens`` is the default ``max_tokens``.
            group_size: episodes per dataset row (GRPO's group).
            reward_fn: scores the final transcript when the agent returns None (import string or
                callable, as ``RLVRWorkflow``); None: an agent returning None is dropped.
            max_turns: model calls per episode; the next one is refused and the episode dropped.
            max_episode_tokens: tokens of the episode's rows (all segments); calls are capped to it.
            episode_timeout_s: wall time of one agent call; past it the episode is dropped.
            max_staleness: drop an episode whose oldest model token is older than
                ``version - max_staleness`` (None: only the executor's group-level bound applies).
                Built from a config, it is ``rollout.max_staleness`` unless ``workflow_kwargs`` sets it.
            segments: ``"all"`` (a row per segment) or ``"last"`` (the final segment only).
            tool_format: how the model writes tool calls, ``"hermes"`` (``<tool_call>{json}</tool_call>``)
                or ``"pythonic"`` (``[name(k=v)]``, compact: the tiny model's); ``rollflow.agents.tool_calls``.
            host, port: where the endpoint listens (port 0: a free one).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if episode_timeout_s <= 0:
            raise ValueError(f"episode_timeout_s must be > 0, got {episode_timeout_s}")
        if segments not in ("all", "last"):
            raise ValueError(f"segments must be 'all' or 'last', got {segments!r}")
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        self.agent: AgentFn = import_string(agent) if isinstance(agent, str) else agent
        if not callable(self.agent):
            raise TypeError(f"agent must be callable, got {self.agent!r}")
        self.tokenizer = load_tokenizer(tokenizer)
        self.sampling = sampling_from(sampling)
        self.group_size = group_size
        self.limits = EpisodeLimits(max_turns, max_episode_tokens, max_staleness)
        self.episode_timeout_s = episode_timeout_s
        self.segments: SegmentPolicy = segments
        self.counts = AgentCounts()
        self.reward_counts = self.counts  # as RLVRWorkflow's: what metrics() reports
        self.endpoint = AgentEndpoint(
            self.tokenizer,
            sampling=self.sampling,
            host=host,
            port=port,
            model_name=model_name,
            counts=self.counts,
            tool_format=tool_format,
        )
        self.reward_runner, self._owns_runner = open_scorer(
            reward_fn, reward_runner, workers=reward_workers, timeout_s=reward_timeout_s
        )
        self._is_async = inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(
            getattr(self.agent, "__call__", None)  # noqa: B004 (an object with async __call__)
        )
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing: asyncio.Task[None] | None = None
        self._sync_agent_threads = sync_agent_threads

    # --- the episode -----------------------------------------------------------------------------------

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        await self.endpoint.astart()
        samples = await asyncio.gather(*(self.arun_agent(client, data) for _ in range(self.group_size)))
        return merge_samples(str(data["prompt_id"]), samples)

    async def arun_agent(self, client: InferenceClient, data: dict[str, Any]) -> list[TrajectoryRow] | None:
        """One episode: the agent's rows, or None (dropped and counted)."""
        return (await self.arun_recorded(client, data))[1]

    async def arun_recorded(
        self, client: InferenceClient, data: dict[str, Any]
    ) -> tuple[EpisodeHandle, list[TrajectoryRow] | None]:
        """``arun_agent`` with the episode's handle (its recorder holds the transcript): for evaluation."""
        await self.endpoint.astart()
        self.counts.episodes += 1
        handle = self.endpoint.open_episode(client, self.limits)
        rec = handle.recorder
        t0 = time.monotonic()
        value: Any = None
        try:
            value = await asyncio.wait_for(self._acall_agent(handle, data), self.episode_timeout_s)
        except asyncio.TimeoutError:  # TimeoutError on 3.11+
            rec.drop("timeout", f"the agent ran past episode_timeout_s={self.episode_timeout_s}")
        except Exception as exc:  # the agent's own bug, or its reaction to a refused call
            if rec.drop_reason is None:
                rec.drop("agent_error", f"the agent raised {type(exc).__name__}: {exc}")
        finally:
            self.endpoint.close_episode(handle, reason=rec.drop_reason or "the agent returned")
        rows = await self._afinish(handle, data, value)
        if rows is None:
            reason = rec.drop_reason or "agent_error"
            self.counts.dropped[reason] += 1
            log = logger.warning if reason in ("agent_error", "bad_reward") else logger.info
            log(
                "agent episode %s dropped (%s) after %.1fs: %s",
                handle.episode_id,
                reason,
                time.monotonic() - t0,
                rec.drop_message,
            )
        else:
            self.counts.episodes_kept += 1
        return handle, rows

    async def _acall_agent(self, handle: EpisodeHandle, data: dict[str, Any]) -> Any:
        if self._is_async:
            return await self.agent(handle.base_url, handle.api_key, data)
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                self._sync_agent_threads, thread_name_prefix="agent"
            )
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self._threads, functools.partial(self.agent, handle.base_url, handle.api_key, data)
        )
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _afinish(
        self, handle: EpisodeHandle, data: dict[str, Any], value: Any
    ) -> list[TrajectoryRow] | None:
        """Judge a finished episode: limits, staleness, reward; its rows or None (``drop_reason`` set)."""
        rec = handle.recorder
        if rec.drop_reason is not None:
            return None
        if not rec.calls:
            rec.drop("no_calls", "the agent never called the model")
            return None
        lim = self.limits
        head, version = rec.head_version(), int(handle.client.get_version())
        if lim.max_staleness is not None and is_stale(
            head, min_trainable_version(version, max_staleness=lim.max_staleness)
        ):
            rec.drop(
                "stale",
                f"oldest token of version {head}, policy at {version}, max_staleness={lim.max_staleness}",
            )
            return None
        if value is None:
            if self.reward_runner is None:
                rec.drop("no_reward", "the agent returned None and the workflow has no reward_fn")
                return None
            try:
                reward, info = await self._ascore(rec, data)
            except RewardInfrastructureError as exc:
                rec.drop("reward_infra", str(exc))
                return None
        else:
            try:
                reward, info = check_reward(value), {}
            except RewardValueError as exc:
                rec.drop("bad_reward", f"the agent returned {value!r}: {exc}")
                return None
        return rec.build_rows(
            prompt_id=str(data["prompt_id"]), reward=reward, policy=self.segments, extra=info
        )

    async def _ascore(self, rec: EpisodeRecorder, data: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        transcript = rec.transcript()
        last = rec.calls[-1]
        if transcript:
            prompt = next(
                (str(m.get("content") or "") for m in reversed(transcript) if m.get("role") == "user"), ""
            )
            completion = str(transcript[-1].get("content") or "")
        else:
            prompt, completion = last.prompt_text or "", last.text
        assert self.reward_runner is not None
        outcome = await self.reward_runner.ascore(
            prompt, completion, data.get("answer"), transcript=transcript, **passthrough(data)
        )
        raise_if_unscored([outcome], data.get("prompt_id"))
        score, info = judge_outcome(outcome)
        self.counts.reward_scored += 1
        self.counts.reward_timeouts += "reward_timed_out" in info
        self.counts.reward_errors += "reward_error" in info
        return score, info

    # --- lifecycle -------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return self.counts.as_metrics()

    async def aclose(self) -> None:
        """Stop the endpoint (on its loop), the agent threads and the reward runner this workflow started."""
        await self.endpoint.aclose()
        self._release()

    def close(self) -> None:
        """``aclose`` from synchronous code: the endpoint's shutdown is scheduled on its loop when that
        loop is the running one (the rollout loop calls this at its end); otherwise it goes with its loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and loop is self.endpoint.loop:
            self._closing = loop.create_task(self.endpoint.aclose())
        self._release()

    def _release(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._owns_runner and self.reward_runner is not None:
            with contextlib.suppress(Exception):
                close_scorer(self.reward_runner)
            self.reward_runner = None
