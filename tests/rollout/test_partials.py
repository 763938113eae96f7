"""Partial episodes across a graceful stop, on a real CPU server and real storage: a stop in the middle of
generation commits the episodes in flight as partial records (tokens, logprobs, per-token versions), the
trainer's shards hold none of them, and the resumed loop continues them: the committed rows start with the
tokens generated before the stop, under the version that made them, and go on under the new version.
Stale partials are discarded (``judge_saved``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from partial_checks import continued_row
from server_waits import running_output_tokens

from rollflow.api.config import ExperimentConfig
from rollflow.inference.routing import control_call
from rollflow.inference.sglang_protocol import ROUTE_UPDATE_WEIGHTS
from rollflow.rollout.loop import run_rollout_loop
from rollflow.rollout.partials import PartialSample, judge_saved
from rollflow.workflows.factory import build_workflow
from storage import keys
from storage.fs import Storage
from storage.partial_records import load_partials
from storage.shard_reader import ShardReader

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


N_PROMPTS = 40  # enough that a fast machine is still generating when the stop comes


def _rows() -> list[dict[str, Any]]:
    return [
        {"prompt_id": f"q{i}", "messages": [{"role": "user", "content": f"{i}+1=?"}], "answer": "1"}
        for i in range(N_PROMPTS)
    ]


def _cfg() -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.train.batch_size = 4
    cfg.rollout.group_size = 2
    cfg.rollout.max_concurrent_rollouts = 2
    cfg.rollout.max_staleness = 100
    cfg.rollout.max_epochs = 1
    cfg.rollout.shard_flush_rows = 2
    cfg.rollout.shard_flush_seconds = 0.05
    cfg.rollout.generation.max_new_tokens = 300  # long enough to be cut in the middle
    cfg.rollout.generation.stop_token_ids = []  # no extra stops (the model's EOS still ends some samples)
    return cfg


def _life(
    cfg: ExperimentConfig, storage: Storage, addr: str, tok: Any, rows: list, stop_after: float | None
) -> Any:
    from rollflow.inference.client import EngineClient

    workflow = build_workflow(cfg, tokenizer=tok)
    stop = threading.Event()
    if stop_after is not None:  # stop that long after the first commit, once the server is mid-generation

        def stop_later() -> None:
            while not storage.list(keys.COMMIT_DIR):
                time.sleep(0.05)
            time.sleep(stop_after)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if running_output_tokens(addr) >= 8:
                    break
                time.sleep(0.005)
            stop.set()

        threading.Thread(target=stop_later, daemon=True).start()

    async def run() -> Any:
        client = EngineClient([addr])
        try:
            return await run_rollout_loop(
                cfg, storage, client, workflow=workflow, prompts=rows, stop_event=stop, poll_interval_s=0.05
            )
        finally:
            await client.aclose()

    try:
        return asyncio.run(run())
    finally:
        workflow.close()  # type: ignore[attr-defined]


def test_a_stop_mid_generation_keeps_partials_and_the_resume_continues_them(
    inference_lib: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = CHAT_TEMPLATE
    rows = _rows()
    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})
    cfg = _cfg()
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        addr = group.addresses[0]
        first = _life(cfg, storage, addr, tok, rows, stop_after=0.3)
        assert first.stopped_by == "stop_event"
        records, _ = load_partials(storage)
        saved = {p: [PartialSample.from_dict(s) for s in ep["samples"]] for p, ep in records.items()}
        cut = [s for samples in saved.values() for s in samples if not s.finished]
        assert cut and all(0 < len(s.output_ids) < 300 for s in cut), saved  # cut in the middle
        assert all(set(s.output_versions) == {0} for s in cut)  # made by version 0
        assert not any(k.startswith(keys.PARTIALS_DIR) for k in storage.list(keys.TRAJECTORIES))
        committed_before = {g.prompt_id for g in ShardReader(storage).take(N_PROMPTS).groups}

        # a new policy version is served before the resume: continued tokens carry version 1
        control_call(addr, ROUTE_UPDATE_WEIGHTS, {"model_path": str(tiny_model_dir_b), "weight_version": "1"})
        t0 = time.monotonic()
        second = _life(cfg, storage, addr, tok, rows, stop_after=None)
        assert second.stopped_by == "epochs", time.monotonic() - t0
    groups = ShardReader(storage).take(N_PROMPTS).groups
    assert sorted(g.prompt_id for g in groups) == sorted(r["prompt_id"] for r in rows)  # each prompt once
    assert not committed_before & {g.prompt_id for g in groups[len(committed_before) :]}
    rows_by_input = [r for g in groups for r in g.rows]
    for s in cut:  # each row starts with the sample's pre-stop tokens at v0 (partial_checks.py) ...
        row = continued_row(rows_by_input, s)
        assert row is not None, s
        assert set(row.versions[len(s.input_ids) + len(s.output_ids) :]) <= {1}  # ... the rest at v1


def test_keep_partials_off_commits_no_record(
    inference_lib: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = CHAT_TEMPLATE
    rows = _rows()
    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})
    cfg = _cfg()
    cfg.rollout.keep_partials = False
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        life = _life(cfg, storage, group.addresses[0], tok, rows, stop_after=0.3)
    assert life.stopped_by == "stop_event" and life.accepted < N_PROMPTS  # stopped with episodes in flight
    assert storage.list(keys.PARTIALS_DIR) == []


def _sample(versions: list[int]) -> PartialSample:
    n = len(versions)
    return PartialSample([1, 2], list(range(n)), [-0.5] * n, versions, "abort", 8)


def test_stale_partials_are_discarded_by_their_oldest_token() -> None:
    # bound = expected consumer version 5 - max_staleness 2 = 3: an episode with a token of v2 is stale
    saved = {0: [_sample([3, 4]), _sample([5])], 1: [_sample([2, 5, 5]), _sample([4])], 2: [_sample([])]}
    kept, dropped, tokens = judge_saved(saved, bound=3)
    assert sorted(kept) == [0, 2] and dropped == 1 and tokens == 4  # episode 1: 3 + 1 tokens
