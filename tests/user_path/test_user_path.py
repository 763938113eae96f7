"""The user's path with a model rollflow did not build: what rollflow does with its chat template, special
tokens and EOS, how ``files`` rows are encoded, and the eval protocol (issue 17, section 2).

The model is the outside task ``bench/tasks/sub_gap`` at a tiny size, built here by its own script
(``make_task.build``: its own character tokenizer with ``<s>``/``</s>``/``<pad>``, a Llama-style
post-processor that adds ``<s>`` on ``add_special_tokens=True``, and a non-ChatML template
``<s>Q: {problem}\\nA: ``). Everything else is the real path: ``load_config`` of the task's config with
``model.path`` and ``dataset.path`` pointed at the build, the real CPU inference server, the rollout
loop writing Parquet shards, the reward runner's worker processes calling a ``module:function`` reward,
and ``rollflow.evaluation.arun_eval``. The expected values are worked out independently of rollflow:
the prompt as hand-written text, token ids from the model's own ``apply_chat_template``, completion
text from the vocabulary, greedy completions from ``transformers``' ``generate``.

What a user should expect, and what is asserted:

* prompt ids sent to generation == ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
  tokenize=True)`` (what TRL sends too): the model's template, one ``<s>``, no rollflow template;
* generation stops at the model's own EOS (``</s>``, id 2; rollflow's tiny tokenizer's is another id);
  the EOS token stays in the trajectory as the last completion token, inside the loss mask (the policy is
  trained to stop, as TRL's completion mask also keeps the first EOS); the reward sees the completion
  text without it;
* a ``files`` row ``{"uid", "problem", "solution", "kind"}`` becomes prompt id ``uid``, one user message
  ``problem``, answer ``solution``; ``kind`` reaches the reward as ``**data``, nothing else does;
* evaluation is greedy, on the first ``eval.n_prompts`` rows of the held-out file in file order, the same
  prompts every time, and agrees with ``bench.peer``'s offline scorer.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "bench" / "tasks" / "sub_gap" / "config.yaml"
REWARD_LOG_ENV = "USER_PATH_REWARD_LOG"
TINY = {"hidden_size": 48, "intermediate_size": 128, "num_hidden_layers": 2}

pytestmark = pytest.mark.slow  # a model build (~10 s) and a CPU server


def recording_reward(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """The task's reward, recording what it was called with (it runs in the reward worker processes)."""
    from bench.tasks.sub_gap.reward import sub_gap_reward_fn

    with open(os.environ[REWARD_LOG_ENV], "a") as fh:
        fh.write(
            json.dumps({"prompt": prompt, "completion": completion, "answer": answer, "data": data}) + "\n"
        )
    return sub_gap_reward_fn(prompt, completion, answer, **data)


class RecordingClient:
    """The real client, keeping every request it was asked to generate (single or batched)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[Any] = []

    async def agenerate(self, request: Any) -> Any:
        self.requests.append(request)
        return await self.inner.agenerate(request)

    async def agenerate_many(self, requests: Sequence[Any]) -> list[Any]:
        self.requests.extend(requests)
        return await self.inner.agenerate_many(requests)

    def get_version(self) -> int:
        return self.inner.get_version()

    def set_version(self, version: int) -> None:
        self.inner.set_version(version)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The outside task at a tiny size (a short warm start: it answers with digits and ``</s>``)."""
    sys.path.insert(0, str(ROOT))
    from bench.tasks.sub_gap import make_task

    out = tmp_path_factory.mktemp("outside") / "sub_gap"
    make_task.build(out, seed=0, steps=250, arch={**make_task.ARCH, **TINY}, threads=1)
    return out


def load_task_config(task_dir: Path, *overrides: str) -> Any:
    from rollflow.configuration.loader import load_config

    return load_config(
        str(CONFIG),
        [
            f"model.path={task_dir / 'model'}",
            f"dataset.path=train={task_dir / 'train.jsonl'},test={task_dir / 'test.jsonl'}",
            "inference.n_servers=1",
            "inference.server_threads=1",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def server(task_dir: Path) -> Iterator[Any]:
    from infra.servers import launch_local_servers

    cfg = load_task_config(task_dir)
    group = launch_local_servers(cfg.inference, cfg.model.path, log_dir=task_dir / "server-logs")
    try:
        yield group
    finally:
        group.stop(timeout_s=10)


@pytest.fixture(scope="module")
def tokenizer(task_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(task_dir / "model")


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def template_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``: a list, or a BatchEncoding (transformers 5)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# --- the model the user built: the premises of the checks below ----------------------------------------------


def test_the_outside_task_imports_nothing_from_rollflow() -> None:
    import ast

    for name in ("make_task.py", "reward.py"):
        tree = ast.parse((CONFIG.parent / name).read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert imported and not [m for m in imported if m.split(".")[0] in ("rollflow", "infra", "storage")]


def test_the_outside_tokenizer_is_not_rollflows(tokenizer: Any) -> None:
    from rollflow.models.tokenizer import build_tokenizer

    ours = build_tokenizer()
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert tokenizer.eos_token_id != ours.eos_token_id  # a rollflow EOS would not stop this model
    assert tokenizer.chat_template != ours.chat_template
    # Llama-style: adding special tokens to an already rendered prompt doubles the BOS
    assert tokenizer.encode("7", add_special_tokens=True) == [1, tokenizer.convert_tokens_to_ids("7")]


# --- files rows -> prompts ------------------------------------------------------------------------------------


def test_files_rows_become_one_user_message_the_answer_and_passthrough_data(task_dir: Path) -> None:
    from rollflow.data import load_prompts

    cfg = load_task_config(task_dir)
    for split in ("train", "test"):
        raw = jsonl(task_dir / f"{split}.jsonl")
        rows = load_prompts(cfg.dataset, split)
        assert len(rows) == len(raw)
        for got, r in zip(rows, raw, strict=True):  # same order as the file
            assert got == {
                "prompt_id": r["uid"],  # dataset.id_field
                "messages": [{"role": "user", "content": r["problem"]}],  # dataset.prompt_field
                "answer": r["solution"],  # dataset.answer_field
                "kind": r["kind"],  # any other column passes through
            }


# --- rollout: prompt ids, EOS, trajectories and what the reward sees -------------------------------------------


@pytest.fixture(scope="module")
def rollout(task_dir: Path, server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Eight train prompts x 4 samples through the real rollout loop (its own workflow, tokenizer and
    prompts from the config; the reward wrapped to record its arguments); the shards read back."""
    from rollflow.inference.client import EngineClient
    from rollflow.rollout.loop import run_rollout_loop
    from storage.fs import Storage
    from storage.shard_reader import ShardReader

    log = tmp_path_factory.mktemp("reward") / "calls.jsonl"
    log.touch()
    os.environ[REWARD_LOG_ENV] = str(log)  # the reward workers start (and inherit it) inside the loop
    cfg = load_task_config(
        task_dir,
        f"dataset.reward_fn={__name__}:recording_reward",
        "dataset.max_rows=8",
        "rollout.max_epochs=1",
        "rollout.group_size=4",
        "rollout.reward_workers=1",
        "train.batch_size=8",
    )
    storage = Storage.open(str(task_dir / "store"), "user-path", "t0", {})
    client = RecordingClient(EngineClient(server.addresses))

    async def run() -> Any:
        try:
            return await run_rollout_loop(cfg, storage, client, poll_interval_s=0.05)
        finally:
            await client.aclose()

    try:
        summary = asyncio.run(run())
    finally:
        os.environ.pop(REWARD_LOG_ENV, None)
    groups = ShardReader(storage).take(100).groups
    return {
        "cfg": cfg,
        "summary": summary,
        "groups": groups,
        "requests": client.requests,
        "calls": jsonl(log),
        "rows": {r["uid"]: r for r in jsonl(task_dir / "train.jsonl")},
    }


def test_prompt_ids_are_the_models_own_chat_template_with_one_bos(
    tokenizer: Any, rollout: dict[str, Any]
) -> None:
    assert rollout["summary"].stopped_by == "epochs"
    groups, rows = rollout["groups"], rollout["rows"]
    assert len(groups) == 8 and len(rollout["requests"]) == 8 * 4
    by_prompt = {}
    for g in groups:
        problem = rows[g.prompt_id]["problem"]
        expected = template_ids(tokenizer, [{"role": "user", "content": problem}])
        # written out by hand: the user's template, not ChatML, and exactly one <s>
        assert tokenizer.convert_ids_to_tokens(expected) == ["<s>", *f"Q: {problem}\nA: "]
        for row in g.rows:
            n_prompt = row.loss_mask.index(1)
            assert row.input_ids[:n_prompt] == expected  # what the trajectory stores as the prompt
            assert row.loss_mask[:n_prompt] == [0] * n_prompt
            assert row.versions[:n_prompt] == [-1] * n_prompt
        by_prompt[tuple(expected)] = problem
    sent = collections.Counter(tuple(r.input_ids) for r in rollout["requests"])
    assert sent == {ids: 4 for ids in by_prompt}  # what generation got: each prompt, once per sample
    assert all(ids[0] == 1 and ids[1] != 1 for ids in sent)  # no double BOS


def test_generation_stops_at_the_models_eos_which_is_trained_on_and_hidden_from_the_reward(
    tokenizer: Any, rollout: dict[str, Any]
) -> None:
    eos, max_new = tokenizer.eos_token_id, rollout["cfg"].rollout.generation.max_new_tokens
    rows, calls = rollout["rows"], rollout["calls"]
    expected_calls = []
    stopped = 0
    for g in rollout["groups"]:
        for row in g.rows:
            n_prompt = row.loss_mask.index(1)
            completion = row.input_ids[n_prompt:]
            assert row.loss_mask[n_prompt:] == [1] * len(completion)  # every generated token, EOS included
            if row.finish_reason == "stop":
                stopped += 1
                assert completion[-1] == eos and eos not in completion[:-1]  # stopped at the first </s>
                text_ids = completion[:-1]
            else:
                assert row.finish_reason == "length" and len(completion) == max_new and eos not in completion
                text_ids = completion
            special = set(tokenizer.all_special_ids)  # the reward sees the text with special tokens skipped
            text = "".join(tokenizer.convert_ids_to_tokens([i for i in text_ids if i not in special]))
            r = rows[g.prompt_id]
            assert row.reward == (1.0 if text.strip() == r["solution"] else 0.0)
            expected_calls.append((r["problem"], text, r["solution"], (("kind", r["kind"]),)))
    assert stopped > 0, "the warm-started model should end some answers with </s>"
    seen = [(c["prompt"], c["completion"], c["answer"], tuple(sorted(c["data"].items()))) for c in calls]
    # the reward saw each completion once: the last user message, the text without </s>, the answer, `kind`
    assert collections.Counter(seen) == collections.Counter(expected_calls)
    assert not any("</s>" in c["completion"] or "<s>" in c["completion"] for c in calls)


# --- evaluation ---------------------------------------------------------------------------------------------


def test_eval_is_greedy_on_the_first_held_out_rows_every_time(
    task_dir: Path, server: Any, tokenizer: Any
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from bench.peer_eval import SnapshotScorer
    from bench.tasks.sub_gap.reward import sub_gap_reward_fn
    from rollflow.data import load_prompts
    from rollflow.evaluation import arun_eval

    n = 24
    cfg = load_task_config(task_dir, f"eval.n_prompts={n}")
    first = asyncio.run(arun_eval(cfg, server.addresses))
    again = asyncio.run(arun_eval(cfg, server.addresses))
    test_rows = jsonl(task_dir / "test.jsonl")
    train_ids = {r["uid"] for r in jsonl(task_dir / "train.jsonl")}
    assert [r["prompt_id"] for r in first.rows] == [r["uid"] for r in test_rows[:n]]  # held out, file order
    assert not train_ids & {r["prompt_id"] for r in first.rows}
    assert [(r["prompt_id"], r["completion"]) for r in again.rows] == [
        (r["prompt_id"], r["completion"]) for r in first.rows
    ]  # the same prompts, and (same weights) the same completions

    model = AutoModelForCausalLM.from_pretrained(task_dir / "model", dtype=torch.float32).eval()
    sampled_differs = 0
    torch.manual_seed(0)
    for row, r in zip(first.rows, test_rows[:n], strict=True):
        ids = torch.tensor([template_ids(tokenizer, [{"role": "user", "content": r["problem"]}])])
        with torch.no_grad():
            greedy = model.generate(
                ids, do_sample=False, max_new_tokens=cfg.rollout.generation.max_new_tokens
            )
            sampled = model.generate(ids, do_sample=True, top_k=0, max_new_tokens=8, num_return_sequences=4)
        want = tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)
        assert row["completion"] == want, r["problem"]  # greedy (eval.greedy), not the rollout's T = 1
        sampled_differs += any(
            tokenizer.decode(s[ids.shape[1] :], skip_special_tokens=True) != want for s in sampled
        )
        assert row["reward"] == sub_gap_reward_fn(r["problem"], want, r["solution"])
    assert sampled_differs > 0  # sampling would have changed some answers: the greedy check has teeth

    eval_rows = load_prompts(cfg.dataset, cfg.dataset.eval_split)[:n]
    scorer = SnapshotScorer(task_dir / "model", eval_rows, sub_gap_reward_fn, max_new_tokens=8)
    assert scorer.accuracy(None) == pytest.approx(first.accuracy)  # bench.peer scores as rollflow evaluates
    # sampled groups (the suite's calibration): near T = 0 every sample is the greedy answer
    correct = scorer.correct(None)
    assert scorer.solve_counts(4, 1e-4) == [4 * c for c in correct]
    counts = scorer.solve_counts(4, 1.0, seed=1)
    assert len(counts) == n and all(0 <= c <= 4 for c in counts)
