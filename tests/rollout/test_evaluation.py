"""rollflow.evaluation: rewards scored through the process-pool runner (with its timeout), strict reward
values, and served-version polling against the real CPU server.

The client here is a scripted stand-in (a unit test of ``aevaluate``); the reward runner and the
inference server are real.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.evaluation import EvalResult, aevaluate, served_version, wait_for_served_version
from rollflow.rewards import AsyncRewardRunner

HANG = "\\boxed{9^{9^{9^{9}}}}"  # sympy evaluates the tower; math-verify's alarm is off-thread only


class CharTokenizer:
    """One token per character (token id = code point), a template that is just the last message."""

    chat_template = "last message"

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
        return str(messages[-1]["content"])

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class AnswerClient:
    """Answers each prompt with ``answers[prompt]`` (no server): lets a test choose the completion."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        ids = [ord(c) for c in self.answers["".join(chr(i) for i in req.input_ids)]]
        return GenerateResult(req.rid or "", req.input_ids, ids, [-0.1] * len(ids), [3] * len(ids), "stop")

    def get_version(self) -> int:
        return 3


def _rows(*prompts: str) -> list[dict[str, Any]]:
    return [
        {"prompt_id": f"p{i}", "messages": [{"role": "user", "content": p}], "answer": "42"}
        for i, p in enumerate(prompts)
    ]


def _evaluate_off_the_main_thread(fn: str, answers: dict[str, str], timeout_s: float) -> EvalResult:
    """Run ``aevaluate`` in a helper thread, as the flow's eval loop does (a thread of a task runner)."""
    out: list[EvalResult] = []

    def run() -> None:
        async def go() -> EvalResult:
            async with AsyncRewardRunner(fn, max_workers=2, timeout_s=timeout_s) as scorer:
                return await aevaluate(
                    AnswerClient(answers), CharTokenizer(), _rows(*answers), scorer, sampling=SamplingParams()
                )

        out.append(asyncio.run(go()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)  # a hang detector only: the runner's 2 s timeout ends the call long before
    assert not thread.is_alive(), "evaluation hung on a reward"
    return out[0]


def test_a_reward_that_would_hang_times_out_and_scores_zero() -> None:
    result = _evaluate_off_the_main_thread(
        "rollflow.rewards.math:math_reward_fn", {"q1": HANG, "q2": "the answer is 42"}, timeout_s=2.0
    )
    by_prompt = {r["prompt"]: r for r in result.rows}
    assert by_prompt["q1"]["reward"] == 0.0 and by_prompt["q1"]["reward_timed_out"]
    assert by_prompt["q2"]["reward"] == 1.0
    assert (result.accuracy, result.reward_timeouts, result.reward_errors) == (0.5, 1, 0)


def test_a_string_reward_is_an_error_not_a_correct_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "rewards"))  # reward_fakes
    result = _evaluate_off_the_main_thread(
        "reward_fakes:string_reward_fn", {"q1": "42"}, timeout_s=10.0
    )  # the function returns "1.0", which float() would have accepted
    assert result.accuracy == 0.0 and result.reward_errors == 1
    assert "not a float" in result.rows[0]["reward_error"]


def test_served_version_reads_every_server(cpu_server: Any) -> None:
    assert served_version([cpu_server.addresses[0]], None) == 0
    assert wait_for_served_version([cpu_server.addresses[0]], None, 0, timeout_s=5) == 0
    with pytest.raises(TimeoutError, match="expected >= 5"):
        wait_for_served_version([cpu_server.addresses[0]], None, 5, timeout_s=0.1)
