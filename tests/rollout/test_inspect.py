"""Decoding committed shards back to prompt | completion | reward | versions (function and CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollflow.rollout.inspect import format_table, main, read_trajectories, sample_trajectories
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter

ROOT = Path(__file__).resolve().parents[2]


def _group(
    tok: Any, i: int, prompt: str, completion: str, versions: tuple[int, int], reward: float
) -> TrajectoryGroup:
    p = tok.encode(prompt, add_special_tokens=False)
    c = tok.encode(completion, add_special_tokens=False)
    vs = [versions[0]] * (len(c) - 1) + [versions[1]]
    row = TrajectoryRow.build(
        traj_id=f"g{i}-0", group_id=f"g{i}", prompt_id=f"p{i}", input_ids=p + c,
        loss_mask=[0] * len(p) + [1] * len(c), logprobs=[0.0] * len(p) + [-0.5] * len(c),
        versions=[-1] * len(p) + vs, reward=reward, finish_reason="stop",
    )  # fmt: skip
    return TrajectoryGroup(f"g{i}", f"p{i}", [row])


def _write_three(storage: Storage, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    with ShardWriter(storage, "w", flush_rows=2) as writer:
        writer.add(_group(tok, 0, "<|im_start|>user\n1+1=?<|im_end|>\n", "2<|im_end|>", (3, 3), 1.0))
        writer.add(_group(tok, 1, "<|im_start|>user\n2+2=?<|im_end|>\n", "5<|im_end|>", (3, 4), 0.0))
        writer.add(_group(tok, 2, "<|im_start|>user\n3+3=?<|im_end|>\n", "6<|im_end|>", (5, 5), 1.0))


@pytest.fixture
def written(storage_spec: Any, tiny_model_dir: Path) -> Any:
    storage = storage_spec.open()
    _write_three(storage, tiny_model_dir)
    return storage_spec, storage


def test_read_trajectories_decodes_prompt_and_completion(written: Any, tiny_model_dir: Path) -> None:
    _, storage = written
    rows = read_trajectories(storage, tokenizer=str(tiny_model_dir), limit=None, newest_first=False)
    assert [r["prompt"] for r in rows] == [f"<|im_start|>user\n{k}+{k}=?<|im_end|>\n" for k in (1, 2, 3)]
    assert [r["completion"] for r in rows] == ["2<|im_end|>", "5<|im_end|>", "6<|im_end|>"]
    assert [r["versions"] for r in rows] == ["v3", "v3-4", "v5"]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0]
    assert rows[0]["completion_tokens"] == rows[0]["trained_tokens"] == 2  # "2", "<|im_end|>"
    newest = read_trajectories(storage, tokenizer=str(tiny_model_dir), limit=2)
    assert [r["prompt_id"] for r in newest] == ["p2", "p1"]
    table = format_table(rows, width=30)
    assert "v3-4" in table and "user\\n2+2=?\\n" in table and len(table.splitlines()) == 5


def test_without_tokenizer_shows_token_ids(written: Any) -> None:
    _, storage = written
    rows = read_trajectories(storage, limit=1)
    assert all(part.isdigit() for part in rows[0]["completion"].split())


def test_cli_prints_the_table(written: Any, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = written
    argv = ["--storage-root", spec.root, "--experiment", spec.experiment, "--trial", spec.trial]
    argv += ["--tokenizer", str(tiny_model_dir), "--limit", "0"]
    argv += [f"--storage-option={k}={v}" for k, v in spec.options.items() if k == "endpoint_url"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split(" | ")[0].strip() == "versions"
    assert "3+3=?" in out and out.rstrip().endswith("3 rows")


def test_cli_runs_as_a_module_and_says_when_there_is_nothing(tmp_path: Path) -> None:
    def inspect(trial: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rollflow.rollout.inspect", "--storage-root", str(tmp_path), "--experiment",
             "e", "--trial", trial],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    proc = inspect("t")  # nothing stored at all
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert "error: no such trial: t under" in proc.stderr and "no trial is stored there" in proc.stderr
    Storage.open(str(tmp_path), "e", "t2", {}).put_json("checkpoints/LATEST", {"version": 0, "path": "x"})
    proc = inspect("t")  # another trial exists: named in the message
    assert proc.returncode == 2 and "trials there: t2" in proc.stderr, proc.stderr
    proc = inspect("t2")  # the trial exists but holds no trajectories yet: not "no such trial"
    assert proc.returncode == 1 and "trial t2 holds no committed trajectories" in proc.stdout, proc.stdout


def test_cli_with_a_config_file_and_sample_trajectories(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = Storage.open(str(tmp_path / "store"), "exp", "t7", {})
    _write_three(storage, tiny_model_dir)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        f"experiment: exp\nstorage:\n  root: {tmp_path / 'store'}\nmodel:\n  path: {tiny_model_dir}\n"
    )
    assert main(["--config", str(cfg), "trial=t7", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "3+3=?" in out and "2+2=?" in out and "1+1=?" not in out  # newest two
    samples = sample_trajectories(storage, str(tiny_model_dir), limit=1)
    assert samples[0]["prompt_id"] == "p2" and samples[0]["completion"] == "6<|im_end|>"
