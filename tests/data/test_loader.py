"""load_prompts on real files (jsonl, parquet, csv, s3:// on moto): field mapping and malformed rows."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollflow.api.config import DatasetConfig
from rollflow.api.errors import ConfigError, DatasetFileError, DatasetRowError
from rollflow.data import gsm8k_dataset_config, load_gsm8k, load_prompts
from rollflow.data.loader import data_files_for
from rollflow.rewards.math import gsm8k_reward_fn

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE = FIXTURES / "gsm8k_sample.jsonl"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _files(path: str, **kw: Any) -> DatasetConfig:
    return DatasetConfig(kind="files", path=path, **kw)


def test_gsm8k_sample_loads_with_bare_references() -> None:
    rows = load_gsm8k(str(SAMPLE), "train")
    assert len(rows) == 21
    first = rows[0]
    assert first["prompt_id"] == "train-0"
    assert first["messages"] == [{"role": "user", "content": first["messages"][0]["content"]}]
    assert first["messages"][0]["content"].startswith("A baker fills 12 trays")
    assert first["answer"] == "26"  # "... #### 26"
    answers = {r["answer"] for r in rows}
    assert {"-7", "2,664", "12.50"} <= answers  # kept as written; the reward normalises
    # The reference solution of every row is judged right by the GSM8K reward.
    raw = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert all(
        gsm8k_reward_fn(r["question"], r["answer"], row["answer"]) == 1.0
        for r, row in zip(raw, rows, strict=True)
    )


def test_parquet_and_csv_with_field_mapping(tmp_path: Path) -> None:
    table = pa.table({"q": ["1+1?", "2+2?"], "ref": [2, 4], "uid": ["a", "b"], "level": [1, 3]})
    pq.write_table(table, tmp_path / "train.parquet")
    (tmp_path / "test.csv").write_text("q,ref,uid,level\n3+3?,6,c,2\n")
    cfg = _files(
        f"train={tmp_path / 'train.parquet'},test={tmp_path / 'test.csv'}",
        prompt_field="q",
        answer_field="ref",
        id_field="uid",
        system_prompt="Be brief.",
    )
    train = load_prompts(cfg, "train")
    assert train[1] == {
        "prompt_id": "b",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        "answer": "4",  # numbers become strings
        "level": 3,  # passthrough
    }
    test = load_prompts(cfg, "test")
    assert [r["prompt_id"] for r in test] == ["c"] and test[0]["answer"] == "6"


def test_messages_field_and_split_template(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    _jsonl(tmp_path / "train.jsonl", [{"conv": chat, "answer": "x"}])
    cfg = _files(str(tmp_path / "{split}.jsonl"), messages_field="conv", system_prompt="ignored")
    rows = load_prompts(cfg, "train")
    assert rows[0]["messages"] == chat  # already has a system turn: not prepended twice
    assert "conv" not in rows[0]


def test_max_rows(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(10)])
    assert [r["answer"] for r in load_prompts(_files(path, max_rows=3), "train")] == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"answer": "1"}, "question", "is missing or null; set dataset.prompt_field"),
        ({"question": 5, "answer": "1"}, "question", "must be a string, got int"),
        ({"question": "   ", "answer": "1"}, "question", "is empty"),
        ({"question": "q"}, "answer", "is missing or null; set dataset.answer_field"),
        ({"question": "q", "answer": None}, "answer", "is missing or null"),
        ({"question": "q", "answer": True}, "answer", "must be a string or number, got bool"),
        ({"question": "q", "answer": ""}, "answer", "is empty"),
    ],
)
def test_malformed_rows_name_index_field_and_fix(
    tmp_path: Path, row: dict[str, Any], field: str, words: str
) -> None:
    good = {"question": "ok", "answer": "1"}
    path = _jsonl(tmp_path / "d.jsonl", [good, good, row])
    with pytest.raises(DatasetRowError) as info:
        load_prompts(_files(path), "train")
    message = str(info.value)
    assert "row 2" in message and f"field {field!r}" in message and words in message
    assert "dataset.on_bad_row=skip" in message


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("latin1.jsonl", b'{"question": "caf\xe9", "answer": "1"}\n', "are not UTF-8 text: byte b'\\xe9'"),
        ("latin1.csv", b"question,answer\ncaf\xe9,1\n", "are not UTF-8 text"),
        ("empty.jsonl", b"", "are empty (no rows)"),
        ("empty.csv", b"", "are empty (no rows)"),
        ("header.csv", b"question,answer\n", "are empty (no rows)"),
        ("blank.jsonl", b"\n\n", "are empty (no rows)"),
    ],
)
def test_unreadable_files_name_the_file(tmp_path: Path, name: str, content: bytes, words: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DatasetFileError) as info:
        load_prompts(_files(str(path)), "train")
    assert str(path) in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ("She has 5 left.", "has no '#### <number>' GSM8K marker"),
        ("reasoning ####", "nothing after '####'"),
        ("reasoning #### five", "GSM8K answer 'five' is not a number"),
    ],
)
def test_unparseable_gsm8k_answers(tmp_path: Path, answer: str, words: str) -> None:
    path = _jsonl(
        tmp_path / "g.jsonl", [{"question": "q", "answer": "x #### 1"}, {"question": "q", "answer": answer}]
    )
    with pytest.raises(DatasetRowError, match="row 1: field 'answer'") as info:
        load_gsm8k(path, "train")
    assert words in str(info.value)


def test_malformed_messages_and_duplicate_ids(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "m.jsonl", [{"conv": [{"role": "robot", "content": "x"}], "answer": "1"}])
    with pytest.raises(DatasetRowError, match=r"row 0: field 'conv\[0\]' must be"):
        load_prompts(_files(path, messages_field="conv"), "train")
    path = _jsonl(tmp_path / "n.jsonl", [{"conv": [{"role": "system", "content": "x"}], "answer": "1"}])
    with pytest.raises(DatasetRowError, match="has no non-empty user message"):
        load_prompts(_files(path, messages_field="conv"), "train")
    path = _jsonl(tmp_path / "i.jsonl", [{"question": "q", "answer": "1", "id": 7}] * 2)
    with pytest.raises(DatasetRowError, match="row 1: field 'id' duplicates the id '7' of row 0"):
        load_prompts(_files(path, id_field="id"), "train")


def test_skip_mode_drops_and_counts_bad_rows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = [
        {"question": "a", "answer": "x #### 1"},
        {"question": "", "answer": "x #### 2"},  # empty prompt
        {"question": "c", "answer": "no marker"},  # unparseable answer
        {"question": "d", "answer": "x #### 4"},
    ]
    path = _jsonl(tmp_path / "g.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="rollflow.data.loader"):
        out = load_gsm8k(path, "train", on_bad_row="skip")
    assert [r["answer"] for r in out] == ["1", "4"]
    assert [r["prompt_id"] for r in out] == ["train-0", "train-3"]  # ids keep the file's row index
    assert "skipped 2 malformed rows of 4" in caplog.text


def test_path_forms() -> None:
    cfg = _files("train=a.jsonl, test = b.jsonl")
    assert (data_files_for(cfg, "train"), data_files_for(cfg, "test")) == ("a.jsonl", "b.jsonl")
    with pytest.raises(ConfigError, match="add validation="):
        data_files_for(cfg, "validation")
    assert data_files_for(_files("d/{split}-*.parquet"), "test") == "d/test-*.parquet"
    one = _files("data/year=2024/x.parquet")  # a '=' inside a path is not a split mapping
    assert data_files_for(one, "train") == "data/year=2024/x.parquet"
    with pytest.raises(ConfigError, match="serves the train split 'train' only"):
        data_files_for(one, "test")  # never reuse the train file as eval data silently
    with pytest.raises(ConfigError, match="cannot infer the format"):
        load_prompts(_files("data.txt"), "train")


@pytest.mark.s3
def test_s3_files_with_storage_options(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import s3fs

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)  # set, it blocks s3:// data files
    # What datasets computes at import from HF_HUB_OFFLINE=1 (and then refuses every remote URL).
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    options = {"key": s3_server.key, "secret": s3_server.secret, "endpoint_url": s3_server.endpoint_url}
    fs = s3fs.S3FileSystem(**options)
    key = f"{s3_server.bucket}/datasets/gsm8k/train.jsonl"
    fs.pipe_file(key, SAMPLE.read_bytes())
    cfg = gsm8k_dataset_config(f"s3://{s3_server.bucket}/datasets/gsm8k/{{split}}.jsonl")
    rows = load_prompts(cfg, "train", storage_options=options)
    assert len(rows) == 21 and rows[0]["answer"] == "26"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_DATASETS_OFFLINE=1 blocks remote data files"):
        load_prompts(cfg, "train", storage_options=options)
