"""RLVRWorkflow and MultiTurnWorkflow against the real CPU inference server (tiny random Llama), plus
the rules for aborted samples and reward failures with small fakes.

The strongest check here is teacher forcing: the behaviour logprobs stored on every loss token equal a
full forward pass of the model over the stored sequence. That holds only if the stored tokens are
exactly the context the server generated from, turn after turn (no re-tokenization drift).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.workflows import MultiTurnWorkflow, RLVRWorkflow
from storage.schema import TrajectoryGroup

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FEEDBACK = "wrong answer try again"  # the tiny vocabulary has lowercase letters, digits and +-*=?:
ROW = {"prompt_id": "q1", "messages": [{"role": "user", "content": "12+30=?"}], "answer": "42"}


class Scorer:
    """Scores from a list, in call order (then the last one forever); records what it was asked."""

    def __init__(
        self, *scores: float, error: str | None = None, timed_out: bool = False, infra_at: int = -1
    ) -> None:
        self.scores, self.error, self.timed_out = list(scores) or [0.0], error, timed_out
        self.infra_at = infra_at  # the call index whose worker "died" (infra_error), -1 for none
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> Any:
        self.calls.append((prompt, completion, answer, data))
        score = self.scores.pop(0) if len(self.scores) > 1 else self.scores[0]
        if len(self.calls) - 1 == self.infra_at:
            return SimpleNamespace(score=0.0, error="reward worker died", timed_out=False, infra_error=True)
        return SimpleNamespace(score=score, error=self.error, timed_out=self.timed_out, infra_error=False)


class RecordingClient:
    """Wraps a real client; keeps every (request, result)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        res = await self.inner.agenerate(req)
        self.calls.append((req, res))
        return res

    def get_version(self) -> int:
        return self.inner.get_version()


def _tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = CHAT_TEMPLATE
    return tok


async def _with_client(addresses: list[str], fn: Any, *, record: bool = True) -> Any:
    """``fn(client)`` with a real client (wrapped in a ``RecordingClient`` when ``record``), closed after."""
    from rollflow.inference.client import EngineClient

    client = EngineClient(addresses)
    try:
        return await fn(RecordingClient(client) if record else client)
    finally:
        await client.aclose()


def _assert_teacher_forced(lib: Any, model_dir: Path, row: Any) -> None:
    """Stored behaviour logprobs == a forward pass over the stored tokens, on every loss token."""
    first = row.loss_mask.index(1)
    expected = lib.teacher_forced_logprobs(model_dir, row.input_ids, first)  # for positions first..T-1
    for t in range(first, len(row.input_ids)):
        if row.loss_mask[t]:
            assert row.logprobs[t] == pytest.approx(expected[t - first], abs=2e-3), t


def test_rlvr_group_rows_with_the_real_server(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    tok = _tokenizer(tiny_model_dir)
    scorer = Scorer(1.0, 0.0, 0.5)
    wf = RLVRWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=8), group_size=3, reward_runner=scorer
    )
    rec_client: list[Any] = []

    async def run(client: Any) -> TrajectoryGroup | None:
        rec_client.append(client)
        return await wf.arun_episode(client, dict(ROW, level=3))

    group = asyncio.run(_with_client(cpu_server.addresses, run))
    assert group is not None and len(group.rows) == 3
    prompt_ids = tok.encode(
        "<|im_start|>user\n12+30=?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    p = len(prompt_ids)
    calls = rec_client[0].calls
    assert len({req.rid for req, _ in calls}) == 3  # independent samples
    by_output = {tuple(res.output_ids): res for _, res in calls}
    for row in group.rows:
        assert row.group_id == group.group_id and row.prompt_id == "q1"
        assert row.input_ids[:p] == prompt_ids
        res = by_output[tuple(row.input_ids[p:])]
        n = len(res.output_ids)
        assert row.loss_mask == [0] * p + [1] * n
        assert row.versions == [-1] * p + [0] * n  # the server serves weight_version "0"
        assert row.logprobs[:p] == [0.0] * p and row.logprobs[p:] == pytest.approx(res.output_logprobs)
        assert (row.head_version, row.tail_version) == (0, 0)
        _assert_teacher_forced(inference_lib, tiny_model_dir, row)
    assert sorted(r.reward for r in group.rows) == [0.0, 0.5, 1.0]
    # the reward sees the question, the decoded completion, the answer and the row's extra fields
    prompt, completion, answer, data = scorer.calls[0]
    assert (prompt, answer, data) == ("12+30=?", "42", {"level": 3})
    assert completion in {tok.decode(r.input_ids[p:], skip_special_tokens=True) for r in group.rows}


def test_rlvr_sends_a_group_as_one_batch_and_scores_it_in_one_round_trip(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    """With the real client and the real reward runner a group of 4 is one /generate and one worker
    round trip, and its rows are as exact as the per-sample path's."""
    from rollflow.inference.client import EngineClient
    from rollflow.rewards import AsyncRewardRunner
    from rollflow.rewards.synthetic import synthetic_reward_fn

    tok = _tokenizer(tiny_model_dir)

    async def run() -> tuple[TrajectoryGroup | None, dict[str, int], Any]:
        client = EngineClient(cpu_server.addresses)
        async with AsyncRewardRunner(synthetic_reward_fn, max_workers=2, timeout_s=30) as runner:
            wf = RLVRWorkflow(
                synthetic_reward_fn, tok, SamplingParams(max_new_tokens=8), group_size=4, reward_runner=runner
            )
            try:
                group = await wf.arun_episode(client, dict(ROW))
            finally:
                await client.aclose()
            return group, dict(client.counters), runner.stats

    group, counters, stats = asyncio.run(run())
    assert group is not None and len(group.rows) == 4
    assert counters["requests"] == 4 and counters["segments"] == 1
    assert stats.calls == 4 and stats.worker_restarts == 0
    for row in group.rows:
        _assert_teacher_forced(inference_lib, tiny_model_dir, row)
        completion = tok.decode(
            [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m], skip_special_tokens=True
        )
        assert row.reward == synthetic_reward_fn("12+30=?", completion, "42")


def test_multi_turn_loss_mask_covers_model_tokens_only(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    tok = _tokenizer(tiny_model_dir)
    wf = MultiTurnWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=6), group_size=2, reward_runner=Scorer(0.0),
        max_turns=3, turn_discount=0.5, feedback=FEEDBACK,
    )  # fmt: skip
    clients: list[Any] = []

    async def run(client: Any) -> TrajectoryGroup | None:
        clients.append(client)
        return await wf.arun_episode(client, dict(ROW))

    group = asyncio.run(_with_client(cpu_server.addresses, run))
    assert group is not None and len(group.rows) == 2
    calls = clients[0].calls
    assert len(calls) == 6  # 2 samples x 3 turns (never right)
    for row in group.rows:
        assert row.n_turns == 3 and row.reward == 0.0
        last = max(
            (c for c in calls if row.input_ids[: len(c[0].input_ids)] == c[0].input_ids),
            key=lambda c: len(c[0].input_ids),
        )
        turns = sorted([c for c in calls if c[0].rid == last[0].rid], key=lambda c: len(c[0].input_ids))
        assert len(turns) == 3  # one rid across the turns of a sample
        # every turn's prompt is the exact token history; its output follows it in the row
        expected_mask: list[int] = []
        for req, res in turns:
            start = len(req.input_ids)
            assert row.input_ids[start : start + len(res.output_ids)] == res.output_ids
            expected_mask += [0] * (start - len(expected_mask)) + [1] * len(res.output_ids)
        assert row.loss_mask == expected_mask
        model_tokens = [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m]
        assert model_tokens == [t for _, res in turns for t in res.output_ids]
        for t, m in enumerate(row.loss_mask):
            if not m:
                assert row.versions[t] == -1 and row.logprobs[t] == 0.0
        # what sits between turns is template + feedback, never trained on
        env = tok.decode(
            row.input_ids[
                len(turns[0][0].input_ids) + len(turns[0][1].output_ids) : len(turns[1][0].input_ids)
            ]
        )
        assert f"<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n" in env
        _assert_teacher_forced(inference_lib, tiny_model_dir, row)


class ScriptedClient:
    """Returns scripted outputs in order (no server): for deterministic template checks."""

    def __init__(self, *outputs: tuple[list[int], str]) -> None:
        self.outputs, self.requests = list(outputs), []

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        self.requests.append(req)
        ids, finish = self.outputs.pop(0)
        return GenerateResult(req.rid or "", req.input_ids, ids, [-0.5] * len(ids), [7] * len(ids), finish)  # type: ignore[arg-type]

    def get_version(self) -> int:
        return 7


def test_multi_turn_does_not_repeat_an_end_of_turn_the_model_produced(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    eos = tok.eos_token_id  # <|im_end|>
    forty = tok.encode("40", add_special_tokens=False)
    fortytwo = tok.encode("42", add_special_tokens=False)
    client = ScriptedClient((forty + [eos], "stop"), (fortytwo, "length"))
    wf = MultiTurnWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=3), group_size=1, reward_runner=Scorer(0.0, 1.0),
        max_turns=3, turn_discount=0.9, feedback=FEEDBACK,
    )  # fmt: skip
    group = asyncio.run(wf.arun_episode(client, dict(ROW)))
    assert group is not None
    (row,) = group.rows
    text = tok.decode(row.input_ids)
    assert text == (
        "<|im_start|>user\n12+30=?<|im_end|>\n<|im_start|>assistant\n40<|im_end|>"  # the model's EOS, once
        f"\n<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n42"
    )
    assert row.n_turns == 2 and row.reward == pytest.approx(0.9)  # 1.0 * 0.9 ** (2 - 1)
    assert sum(row.loss_mask) == len(forty) + 1 + len(fortytwo)
    assert client.requests[1].input_ids == row.input_ids[: len(client.requests[1].input_ids)]
    assert client.requests[0].rid == client.requests[1].rid
    assert row.finish_reason == "length"


def test_aborted_samples_are_dropped_and_an_all_aborted_group_is_rejected(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    wf = RLVRWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=2), group_size=3, reward_runner=Scorer(1.0)
    )
    some = ScriptedClient(([5], "stop"), ([6], "abort"), ([7], "length"))
    group = asyncio.run(wf.arun_episode(some, dict(ROW)))
    assert group is not None and len(group.rows) == 2
    assert [r.traj_id for r in group.rows] == [f"{group.group_id}-0", f"{group.group_id}-1"]
    assert wf.reward_counts.dropped_samples == 1
    none = ScriptedClient(([5], "abort"), ([6], "abort"), ([7], "abort"))
    assert asyncio.run(wf.arun_episode(none, dict(ROW))) is None


@pytest.mark.parametrize(
    ("error", "timed_out", "key"),
    [("ZeroDivisionError: boom", False, "reward_error"), (None, True, "reward_timed_out")],
)
def test_reward_errors_and_timeouts_score_zero_and_are_counted(
    tiny_model_dir: Path, error: str | None, timed_out: bool, key: str
) -> None:
    tok = _tokenizer(tiny_model_dir)
    scorer = Scorer(0.0, error=error, timed_out=timed_out)
    wf = RLVRWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=2), group_size=2, reward_runner=scorer
    )
    group = asyncio.run(wf.arun_episode(ScriptedClient(([5], "stop"), ([6], "stop")), dict(ROW)))
    assert group is not None and [r.reward for r in group.rows] == [0.0, 0.0]
    assert all(key in r.extra for r in group.rows)
    counts = wf.reward_counts
    assert (counts.errors, counts.timeouts) == ((2, 0) if error else (0, 2))


def test_a_dead_reward_worker_drops_the_group_instead_of_training_on_zero(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    scorer = Scorer(1.0, infra_at=1)
    wf = RLVRWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=2), group_size=3, reward_runner=scorer
    )
    client = ScriptedClient(([5], "stop"), ([6], "stop"), ([7], "stop"))
    assert asyncio.run(wf.arun_episode(client, dict(ROW))) is None
    assert wf.reward_counts.as_metrics()["groups_dropped_reward_infra"] == 1.0
    # The next group, whose rewards all arrive, is kept.
    group = asyncio.run(wf.arun_episode(ScriptedClient(*[([5], "stop")] * 3), dict(ROW)))
    assert group is not None and [r.reward for r in group.rows] == [1.0, 1.0, 1.0]


def test_a_dead_reward_worker_drops_a_multi_turn_group(tiny_model_dir: Path) -> None:
    tok = _tokenizer(tiny_model_dir)
    wf = MultiTurnWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=2), group_size=2,
        reward_runner=Scorer(1.0, infra_at=0),
    )  # fmt: skip
    assert asyncio.run(wf.arun_episode(ScriptedClient(([5], "stop"), ([6], "stop")), dict(ROW))) is None
    assert wf.reward_counts.dropped_groups_infra == 1


def test_tokenizer_without_chat_template_is_a_clear_error(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = None
    wf = RLVRWorkflow("builtins:len", tok, group_size=1, reward_runner=Scorer(1.0))
    with pytest.raises(ValueError, match="chat_template"):
        asyncio.run(wf.arun_episode(ScriptedClient(([5], "stop")), dict(ROW)))


def test_multi_turn_tokens_equal_the_rendered_conversation_with_the_embedded_tokenizer() -> None:
    """With the embedded default's tokenizer (ChatML, role names as whole tokens) the spliced sequence
    is exactly the tokenization of the whole rendered conversation: no drift at turn boundaries."""
    from rollflow.models import build_tokenizer
    from rollflow.workflows.multi_turn import DEFAULT_FEEDBACK

    tok = build_tokenizer()
    eos = tok.eos_token_id
    out1 = tok.encode("40", add_special_tokens=False) + [eos]
    out2 = tok.encode("41", add_special_tokens=False) + [eos]
    out3 = tok.encode("4", add_special_tokens=False)  # cut by max_new_tokens: no EOS
    client = ScriptedClient((out1, "stop"), (out2, "stop"), (out3, "length"))
    wf = MultiTurnWorkflow(
        "builtins:len", tok, SamplingParams(max_new_tokens=3), group_size=1, reward_runner=Scorer(0.0),
        max_turns=3,
    )  # fmt: skip
    group = asyncio.run(wf.arun_episode(client, dict(ROW)))
    assert group is not None
    (row,) = group.rows
    convo = [
        ROW["messages"][0],
        {"role": "assistant", "content": "40"},
        {"role": "user", "content": DEFAULT_FEEDBACK},
        {"role": "assistant", "content": "41"},
        {"role": "user", "content": DEFAULT_FEEDBACK},
    ]
    rendered = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True) + "4"
    assert row.input_ids == tok.encode(rendered, add_special_tokens=False)
    assert sum(row.loss_mask) == len(out1) + len(out2) + len(out3)
    assert row.n_turns == 3 and row.reward == 0.0 and row.versions.count(7) == sum(row.loss_mask)


# --- docs/workflows.md's example, end to end ----------------------------------------------------------------

EXAMPLE = "examples.workflows.length_penalty:LengthPenaltyWorkflow"
REPO = Path(__file__).resolve().parents[2]  # examples/ is imported from the repository root


def digits_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """A reward the random tiny model sometimes earns: the share of the completion's characters that are
    digits (run in the reward runner's worker processes, by this import string)."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def test_the_documented_example_workflow_runs_end_to_end(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/workflows.md's example, built from a config by ``build_workflow`` and run by the rollout loop
    against the real CPU server and reward workers: its rows reach storage with the documented reward."""
    from rollflow.api.config import ExperimentConfig
    from rollflow.rollout.loop import run_rollout_loop
    from rollflow.workflows.factory import build_workflow
    from storage.fs import Storage
    from storage.shard_reader import ShardReader

    monkeypatch.syspath_prepend(str(REPO))
    cfg = ExperimentConfig()
    cfg.rollout.workflow, cfg.rollout.workflow_kwargs = EXAMPLE, {"length_penalty": 0.5}
    cfg.rollout.group_size, cfg.rollout.max_epochs, cfg.rollout.shard_flush_rows = 3, 1, 2
    cfg.rollout.generation.max_new_tokens = 6
    cfg.dataset.reward_fn = f"{__name__}:digits_reward_fn"
    tok = _tokenizer(tiny_model_dir)
    workflow = build_workflow(cfg, tokenizer=tok)
    assert type(workflow).__name__ == "LengthPenaltyWorkflow" and workflow.group_size == 3  # type: ignore[attr-defined]
    rows = [
        {"prompt_id": f"q{i}", "messages": [{"role": "user", "content": q}], "answer": str(eval(q[:-2]))}
        for i, q in enumerate(["1+1=?", "2+3=?", "4+4=?"])
    ]
    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})

    def loop(client: Any) -> Any:  # the rollout loop, as the rollout task runs it
        return run_rollout_loop(cfg, storage, client, workflow=workflow, prompts=rows, poll_interval_s=0.05)

    try:
        summary = asyncio.run(_with_client(cpu_server.addresses, loop, record=False))
        metrics = workflow.metrics()
    finally:
        workflow.close()
    assert summary.stopped_by == "epochs" and summary.accepted == 3
    groups = ShardReader(storage).take(100).groups
    assert sorted(g.prompt_id for g in groups) == ["q0", "q1", "q2"]
    truncated = 0
    for group in groups:
        assert len(group.rows) == 3
        for row in group.rows:
            n_out = sum(row.loss_mask)
            p = len(row.input_ids) - n_out
            assert row.loss_mask == [0] * p + [1] * n_out and row.versions == [-1] * p + [0] * n_out
            completion = tok.decode(row.input_ids[p:], skip_special_tokens=True)
            score = digits_reward_fn("", completion, "")
            # reward = score - length_penalty * n_tokens / max_new_tokens, e.g. 0.5 - 0.5 * 4 / 6 = 1/6
            assert row.reward == pytest.approx(score - 0.5 * n_out / 6)
            assert '"score"' in row.extra
            truncated += row.finish_reason == "length"
        _assert_teacher_forced(inference_lib, tiny_model_dir, group.rows[0])
    assert metrics["reward_scored"] == 9.0 and metrics["reward_errors"] == 0.0
    assert metrics["completions_truncated"] == float(truncated)


def test_unknown_workflow_kwargs_are_a_config_error_that_names_them(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollflow.api.config import ExperimentConfig
    from rollflow.api.errors import ConfigError
    from rollflow.workflows.factory import build_workflow

    monkeypatch.syspath_prepend(str(REPO))
    cfg = ExperimentConfig()
    cfg.rollout.workflow = EXAMPLE
    cfg.rollout.workflow_kwargs = {"length_penalty": 0.2, "lenght_penalty": 0.2, "max_turns": 3}
    with pytest.raises(ConfigError) as info:
        build_workflow(cfg, tokenizer=_tokenizer(tiny_model_dir))
    assert str(info.value) == (
        "config key 'rollout.workflow_kwargs': lenght_penalty, max_turns are not arguments of "
        f"{EXAMPLE}; it takes reward_fn, tokenizer, sampling, group_size, length_penalty, reward_workers, "
        "reward_timeout_s. Remove or rename them"
    )
    cfg.rollout.workflow = "rollflow.workflows.rlvr:RLVRWorkflow"
    cfg.rollout.workflow_kwargs = {"max_turns": 3}  # a MultiTurnWorkflow argument
    with pytest.raises(
        ConfigError, match="max_turns is not an argument of rollflow.workflows.rlvr:RLVRWorkflow"
    ):
        build_workflow(cfg, tokenizer=_tokenizer(tiny_model_dir))


def test_docs_workflows_md_shows_the_example_episode_as_it_is() -> None:
    """docs/workflows.md quotes the example's ``arun_episode`` in full: it must not drift from the file."""
    import textwrap

    doc = (REPO / "docs" / "workflows.md").read_text()
    quoted = doc.split("Its episode, in full:\n\n```python\n", 1)[1].split("```", 1)[0]
    source = (REPO / "examples" / "workflows" / "length_penalty.py").read_text()
    episode = source[source.index("    async def arun_episode") : source.index("    def metrics")]
    assert textwrap.dedent(episode).strip() == quoted.strip()
