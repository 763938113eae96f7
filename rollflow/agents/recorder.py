"""EpisodeRecorder: every model call of one agent episode, its limits, and the trajectory rows built from it.

What it is. The endpoint records each call as the engine saw it: the prompt ids as sent, the completion
ids, their behaviour logprobs and per-token policy versions. Rows are assembled from these ids only,
never by re-tokenizing a transcript.

Segments. A call whose prompt starts with the previous call's context (its prompt + completion) extends
the current segment; any other call starts a new one. Within a segment every call's prompt contains all
earlier calls' tokens at the same positions, so the segment's sequence is its last call's context and
each call's completion sits at ``[len(prompt_k), len(prompt_k) + len(completion_k))``. Per token
``t`` of a segment of ``T`` tokens:

    input_ids = prompt_ids(last) + completion_ids(last)                              # [T]
    loss_mask[t] = 1  if t lies in some call's completion, else 0                    # [T]
    logprobs[t]  = that call's behaviour logprob at t, else 0.0                      # [T]
    versions[t]  = the policy version that produced token t, else -1                 # [T]

Example (hand-worked): call 1 prompt [a b] -> completion [c d]; call 2 prompt [a b c d e] -> [f]:
one segment, input_ids [a b c d e f], loss_mask [0 0 1 1 0 1] (``e``, the tool's text, is context).
A call 3 with prompt [a x] starts segment 2: input_ids [a x ...] with its own completion.

How segments train (``segments``): ``"all"`` (default) makes one row per segment, each with the
episode's reward, in the episode's group; GRPO's group mean and std then count an episode of ``k``
segments ``k`` times. ``"last"`` keeps only the last segment (the one holding the final answer) and
drops the tokens of the rewritten ones.

Limits, checked by ``admit`` before a call reaches the engine (each raises ``EpisodeLimitError`` and
marks the episode dropped):

    max_turns:          calls so far < max_turns
    max_episode_tokens: sum(len(closed segments)) + len(prompt) < max_episode_tokens, and the call's
                        max_new_tokens is capped to what is left (so the rows never exceed the budget)
    max_staleness:      head_version >= current_version - max_staleness   (head = oldest model token)

What it is not: no HTTP, no tokenization, no reward (``rollflow.workflows.agent`` does the episode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rollflow.agents.openai_protocol import Message
from rollflow.api.errors import EpisodeLimitError
from rollflow.api.staleness import is_stale, min_trainable_version
from storage.schema import TrajectoryRow

SegmentPolicy = Literal["all", "last"]


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 32
    max_episode_tokens: int = 8192
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_episode_tokens < 2:
            raise ValueError(f"max_episode_tokens must be >= 2, got {self.max_episode_tokens}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")


@dataclass
class CallRecord:
    """One model call as the engine saw it."""

    index: int
    kind: Literal["chat", "completion"]
    prompt_ids: list[int]  # [P] as sent
    output_ids: list[int]  # [O]
    logprobs: list[float]  # [O] behaviour logprobs
    versions: list[int]  # [O] policy version per token
    finish_reason: str  # the engine's: stop | length | abort
    segment: int = 0
    text: str = ""  # the completion decoded (special tokens skipped), as returned
    messages: list[Message] | None = None  # chat: the request's messages
    tools: list[dict[str, Any]] | None = None
    reply: Message | None = None  # chat: the assistant message returned
    prompt_text: str | None = None  # completion: the request's prompt text
    latency_s: float = 0.0

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass
class EpisodeRecorder:
    """The calls of one episode, in the order they finished (see the module docstring)."""

    episode_id: str
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    calls: list[CallRecord] = field(default_factory=list)
    admitted: int = 0
    drop_reason: str | None = None
    drop_message: str = ""

    # --- limits ----------------------------------------------------------------------------------------

    def drop(self, reason: str, message: str) -> None:
        """Mark the episode dropped (the first reason wins)."""
        if self.drop_reason is None:
            self.drop_reason, self.drop_message = reason, message

    def admit(self, prompt_ids: list[int], max_new_tokens: int, *, version: int) -> int:
        """Count a call that is about to be sent; the ``max_new_tokens`` it may use.

        Raises:
            EpisodeLimitError: the call would break a limit; the episode is marked dropped.
        """
        lim = self.limits
        try:
            if self.admitted >= lim.max_turns:
                raise EpisodeLimitError(
                    "max_turns",
                    f"episode {self.episode_id}: call {self.admitted + 1} exceeds max_turns={lim.max_turns}",
                )
            head = self.head_version()
            if lim.max_staleness is not None and is_stale(
                head, min_trainable_version(version, max_staleness=lim.max_staleness)
            ):
                raise EpisodeLimitError(
                    "stale",
                    f"episode {self.episode_id}: its oldest token is of version {head}, the policy is at "
                    f"{version} and max_staleness={lim.max_staleness}",
                )
            used = self.tokens_before(prompt_ids)
            left = lim.max_episode_tokens - used
            if left <= 0:
                raise EpisodeLimitError(
                    "token_budget",
                    f"episode {self.episode_id}: {used} tokens (earlier segments + this prompt) reach "
                    f"max_episode_tokens={lim.max_episode_tokens}",
                )
        except EpisodeLimitError as exc:
            self.drop(exc.reason, str(exc))
            raise
        self.admitted += 1
        return min(max_new_tokens, left)

    def tokens_before(self, prompt_ids: list[int]) -> int:
        """Tokens the episode's rows would hold with ``prompt_ids`` sent next (before its completion)."""
        segs = self.segments()
        if segs and self.extends(prompt_ids):
            closed = segs[:-1]
        else:
            closed = segs
        return sum(len(seg[-1].context) for seg in closed) + len(prompt_ids)

    # --- recording -------------------------------------------------------------------------------------

    def context_ids(self) -> list[int]:
        """The current segment's tokens (the last call's prompt + completion), [] before any call."""
        return self.calls[-1].context if self.calls else []

    def extends(self, prompt_ids: list[int]) -> bool:
        ctx = self.context_ids()
        return bool(self.calls) and prompt_ids[: len(ctx)] == ctx

    def record(self, call: CallRecord) -> CallRecord:
        """Append ``call``, giving it its segment (the current one when its prompt extends it)."""
        n = len(call.output_ids)
        if len(call.logprobs) != n or len(call.versions) != n:
            raise ValueError(
                f"call {call.index}: {n} output ids but {len(call.logprobs)} logprobs, {len(call.versions)} versions"
            )
        if not self.calls:
            call.segment = 0
        else:
            call.segment = self.calls[-1].segment + (0 if self.extends(call.prompt_ids) else 1)
        self.calls.append(call)
        return call

    def segments(self) -> list[list[CallRecord]]:
        out: list[list[CallRecord]] = []
        for c in self.calls:
            if not out or out[-1][0].segment != c.segment:
                out.append([])
            out[-1].append(c)
        return out

    def head_version(self) -> int:
        """The oldest version among the model's tokens (-1 before any)."""
        versions = [v for c in self.calls for v in c.versions]
        return min(versions) if versions else -1

    def n_tokens(self, policy: SegmentPolicy = "all") -> int:
        segs = self.segments() if policy == "all" else self.segments()[-1:]
        return sum(len(seg[-1].context) for seg in segs)

    # --- rows ------------------------------------------------------------------------------------------

    def build_rows(
        self,
        *,
        prompt_id: str,
        reward: float,
        policy: SegmentPolicy = "all",
        extra: dict[str, Any] | None = None,
    ) -> list[TrajectoryRow]:
        """One row per segment (``"all"``) or the last segment's row (``"last"``), ids filled in later."""
        segs = self.segments()
        chosen = list(enumerate(segs)) if policy == "all" else list(enumerate(segs))[-1:]
        rows = []
        for s, seg in chosen:
            ids = seg[-1].context  # [T]
            mask = [0] * len(ids)  # [T]
            logps = [0.0] * len(ids)  # [T]
            versions = [-1] * len(ids)  # [T]
            for c in seg:
                start = len(c.prompt_ids)
                if ids[: start + len(c.output_ids)] != c.context:  # by construction; a bug otherwise
                    raise AssertionError(
                        f"episode {self.episode_id}: call {c.index} is not a prefix of its segment"
                    )
                for j in range(len(c.output_ids)):
                    mask[start + j] = 1
                    logps[start + j] = c.logprobs[j]
                    versions[start + j] = c.versions[j]
            info = {
                "agent_episode": self.episode_id,
                "segment": s,
                "n_segments": len(segs),
                "n_calls": len(seg),
                "n_tool_calls": sum(len((c.reply or {}).get("tool_calls") or []) for c in seg),
                **(extra or {}),
            }
            rows.append(
                TrajectoryRow.build(
                    traj_id="pending",
                    group_id="pending",
                    prompt_id=prompt_id,
                    input_ids=ids,
                    loss_mask=mask,
                    logprobs=logps,
                    versions=versions,
                    reward=reward,
                    finish_reason=seg[-1].finish_reason,
                    n_turns=len(seg),
                    extra=info,
                )
            )
        return rows

    def transcript(self) -> list[Message]:
        """The final conversation: the last chat call's messages and the reply; [] without chat calls."""
        for c in reversed(self.calls):
            if c.kind == "chat" and c.messages is not None and c.reply is not None:
                return [*c.messages, c.reply]
        return []
