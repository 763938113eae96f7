"""bootstrap_tiny_model: a loadable HF directory, deterministic, idempotent, atomic; and the CLI.

Fast tests use a very small config (hidden 32, 1 layer, a few warm-start steps); the default model
and its accuracy are checked by the slow test at the end and by ``python -m bench.task_check``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollflow.api.config import TinyModelConfig
from rollflow.models import bootstrap_tiny_model, read_marker
from rollflow.models.bootstrap import MARKER, main

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, warm_start_steps=3)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _sha(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_writes_a_loadable_llama_directory(tmp_path: Path) -> None:
    out = bootstrap_tiny_model(SMALL, tmp_path / "tiny", seed=1)
    assert out == (tmp_path / "tiny").resolve()
    names = set(os.listdir(out))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary dirs left behind
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.eos_token_id == tok.eos_token_id == 3 and model.config.pad_token_id == 0
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "12+35="}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out_ids = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out_ids.shape[1] <= ids["input_ids"].shape[1] + 4
    marker = read_marker(out)
    assert marker is not None and marker["weights_sha256"] == _sha(out)
    assert marker["key"]["seed"] == 1 and marker["key"]["tiny"]["hidden_size"] == 32


def test_deterministic_for_a_seed_and_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = bootstrap_tiny_model(SMALL, tmp_path / "a", seed=5)
    assert torch.equal(torch.rand(1), expected_next)  # the caller's RNG stream is untouched
    b = bootstrap_tiny_model(SMALL, tmp_path / "b", seed=5)
    c = bootstrap_tiny_model(SMALL, tmp_path / "c", seed=6)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_idempotent_and_rebuilds_on_a_different_config(tmp_path: Path) -> None:
    out = bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    again = bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1)
    assert again == out and (out / "model.safetensors").stat().st_mtime_ns == mtime  # not rewritten
    changed = dataclasses.replace(SMALL, warm_start_steps=4)
    bootstrap_tiny_model(changed, tmp_path / "m", seed=1)
    assert read_marker(out)["key"]["tiny"]["warm_start_steps"] == 4  # type: ignore[index]
    bootstrap_tiny_model(changed, tmp_path / "m", seed=2)
    assert read_marker(out)["key"]["seed"] == 2  # type: ignore[index]
    assert sorted(p for p in os.listdir(tmp_path)) == ["m"]  # the old directories were removed


def test_a_half_written_directory_is_never_taken_for_a_finished_one(tmp_path: Path) -> None:
    # A crash mid-build leaves only the hidden temporary directory; the target does not exist yet.
    (tmp_path / ".m.tmp-dead").mkdir()
    (tmp_path / ".m.tmp-dead" / "config.json").write_text("{}")
    out = bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1)
    assert read_marker(out) is not None
    # A directory with model files but no marker (someone else's, or a copy cut short) is refused,
    # not trusted and not overwritten.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"partial")
    with pytest.raises(FileExistsError, match="not a rollflow tiny-model directory"):
        bootstrap_tiny_model(SMALL, foreign, seed=1)
    assert (foreign / "model.safetensors").read_bytes() == b"partial"
    # A corrupt marker is no marker.
    (out / MARKER).write_text("{not json")
    assert read_marker(out) is None
    # An empty directory is fine to fill.
    (tmp_path / "empty").mkdir()
    assert read_marker(bootstrap_tiny_model(SMALL, tmp_path / "empty", seed=1)) is not None


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollflow.models.bootstrap.TinyModelConfig", lambda: SMALL)
    assert main(["--out", str(tmp_path / "cli"), "--seed", "3", "--steps", "2"]) == 0
    assert capsys.readouterr().out.strip() == str((tmp_path / "cli").resolve())
    marker = read_marker(tmp_path / "cli")
    assert marker is not None and marker["key"]["seed"] == 3 and marker["warm_start"]["steps"] == 2
    assert main(["--out", str(tmp_path / "cli"), "--task", "shift_gap", "--steps", "2"]) == 0
    assert read_marker(tmp_path / "cli")["key"]["task"] == "shift_gap"  # type: ignore[index]


def test_the_marker_records_the_task_and_another_task_rebuilds(tmp_path: Path) -> None:
    out = bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1)
    assert read_marker(out)["key"]["task"] == "add_habit"  # type: ignore[index]  # the default
    habit_sha = _sha(out)
    bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1, task="add_gap")
    assert read_marker(out)["key"]["task"] == "add_gap"  # type: ignore[index]
    assert _sha(out) != habit_sha  # other warm-start data, other weights
    with pytest.raises(ValueError, match="unknown synthetic task 'sub_gap'"):
        bootstrap_tiny_model(SMALL, tmp_path / "m", seed=1, task="sub_gap")  # type: ignore[arg-type]
    assert read_marker(out)["key"]["task"] == "add_gap"  # type: ignore[index]  # left as it was
    assert sorted(os.listdir(tmp_path)) == ["m"]


@pytest.mark.parametrize(
    ("task", "width"),
    # The chat rendering of "12+35=" is 14 tokens (<|im_start|> user \n, 6 characters, <|im_end|> \n
    # <|im_start|> assistant \n); completions are up to 3 digits + <|im_end|> (add_habit: "100"),
    # 2 digits + <|im_end|> (add_gap). shift_gap: "abcd+5=" is 15 tokens, then 4 letters + <|im_end|>.
    [("add_habit", 14 + 4), ("add_gap", 14 + 3), ("shift_gap", 15 + 5)],
)
def test_warm_start_batches_are_prompt_then_completion_from_the_support(task: str, width: int) -> None:
    from rollflow.data.synthetic import task_module
    from rollflow.models.bootstrap import _WarmStartData
    from rollflow.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    data = _WarmStartData(tok, task, 1.0, seed=1)  # type: ignore[arg-type]
    ids, mask = data.batch(64, 1.0)
    assert ids.shape == mask.shape == (64, width)
    support = {p.text: p.answer for p in task_module(task).warm_start_pool()}
    held_out = {p.text for p in task_module(task).problem_pool("test")}
    for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
        start = m.index(1)
        end = start + sum(m)
        assert m[start:end] == [1] * (end - start)  # one run of completion tokens
        assert all(t == tok.pad_token_id for t in row[end:])  # padding only after the completion
        prompt = tok.decode(row[:start])
        assert prompt.startswith("<|im_start|>user\n") and prompt.endswith(
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        text = prompt.removeprefix("<|im_start|>user\n").split("<|im_end|>")[0]
        assert text in support and text not in held_out
        assert tok.decode(row[start:end]) == support[text] + "<|im_end|>"  # right labels (p_correct=1)


@pytest.mark.slow
def test_default_model_is_small_and_has_the_habit(tmp_path: Path) -> None:
    """The demo's starting point (see rollflow.data.tasks.add_habit): greedy says the sum + 1."""
    from rollflow.api.config import SyntheticTaskConfig
    from rollflow.data.tasks.add_habit import sample_problems

    out = bootstrap_tiny_model(TinyModelConfig(warm_start_steps=500), tmp_path / "tiny", seed=1)
    marker = read_marker(out)
    assert marker is not None and 500_000 <= marker["params"] <= 2_000_000
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    problems = sample_problems("test", 200, seed=SyntheticTaskConfig().seed)  # the demo's eval set
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=False
        )
        for p in problems
    ]
    batch = tok(prompts, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        greedy = model.generate(**batch, max_new_tokens=5, do_sample=False)
    texts = [
        t.strip()
        for t in tok.batch_decode(greedy[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    ]
    accuracy = sum(t == p.answer for t, p in zip(texts, problems, strict=True)) / len(problems)
    assert 0.05 <= accuracy <= 0.30
    habit = [p for p in problems if not p.round_operand]
    said_plus_one = sum(
        t == p.distractor for t, p in zip(texts, problems, strict=True) if not p.round_operand
    )
    assert said_plus_one / len(habit) >= 0.6  # the habit is what greedy decoding shows


def test_a_task_with_a_probe_trains_on_until_its_budget_and_the_marker_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """tool_lookup declares a probe (its two copies): after the clean phase (2 of 4 steps) it fails on an
    untrained model, so the warm start adds up to warm_start_probe_extra_steps clean steps, then the habit;
    the marker records the probes (after the clean phase, after each chunk, at the end) and the steps."""
    cfg = dataclasses.replace(
        SMALL,
        warm_start_steps=4,
        warm_start_batch_size=4,
        warm_start_clean_fraction=0.5,
        warm_start_probe_extra_steps=3,
    )
    with caplog.at_level("INFO", logger="rollflow.models.bootstrap"):
        out = bootstrap_tiny_model(cfg, tmp_path / "agent", seed=1, task="tool_lookup")
    stats = read_marker(out)["warm_start"]  # type: ignore[index]
    assert stats["probe_extra_steps"] == 3
    assert [p["step"] for p in stats["probes"]] == [2, 5, 7]
    assert all(set(p["accuracy"]) == {"key", "digit"} and not p["passed"] for p in stats["probes"])
    assert "still fails after 3 extra steps" in caplog.text
    no_extra = dataclasses.replace(cfg, warm_start_probe_extra_steps=0)
    stats = read_marker(bootstrap_tiny_model(no_extra, tmp_path / "b", seed=1, task="tool_lookup"))[
        "warm_start"
    ]  # type: ignore[index]
    assert stats["probe_extra_steps"] == 0 and [p["step"] for p in stats["probes"]] == [2, 4]
    habit = read_marker(bootstrap_tiny_model(cfg, tmp_path / "c", seed=1))["warm_start"]  # type: ignore[index]
    assert "probes" not in habit  # a task without a probe: the warm start as before
