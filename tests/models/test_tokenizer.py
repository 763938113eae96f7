"""The per-character chat tokenizer: round trips, the chat template, and reloading via AutoTokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaConfig

from rollflow.models.tokenizer import CHARACTERS, IM_END, ROLE_TOKENS, SPECIAL_TOKENS, build_tokenizer


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_vocabulary_and_special_tokens() -> None:
    tok = build_tokenizer()
    assert len(tok) == len(SPECIAL_TOKENS) + len(ROLE_TOKENS) + len(CHARACTERS) == 4 + 3 + 97
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token, tok.eos_token_id) == (0, 1, IM_END, 3)
    assert tok.bos_token is None  # nothing is prepended: the chat template carries all framing
    assert tok.encode("12+35=", add_special_tokens=False) == [tok.convert_tokens_to_ids(c) for c in "12+35="]


def test_round_trip_keeps_spaces_and_newlines() -> None:
    tok = build_tokenizer()
    text = "Hello, world!\n  two spaces\tand a tab {x: [1, 2]} ~"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.decode(tok.encode("é", add_special_tokens=False)) == "<|unk|>"  # outside ASCII
    assert tok.encode("user", add_special_tokens=False) == [tok.convert_tokens_to_ids("user")]  # one token


def test_chat_template() -> None:
    tok = build_tokenizer()
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "12+35="}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (
        text
        == "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n12+35=<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages[1:], add_generation_prompt=True, tokenize=True, return_dict=False)
    # <|im_start|> user \n 1 2 + 3 5 = <|im_end|> \n <|im_start|> assistant \n  = 14 tokens
    assert len(ids) == 14
    assert tok.decode(ids) == text[text.index("<|im_start|>user") :]
    turn = tok.apply_chat_template([*messages[1:], {"role": "assistant", "content": "47"}], tokenize=False)
    assert turn.endswith("<|im_start|>assistant\n47<|im_end|>\n")


def test_reloads_unchanged_through_autotokenizer_under_a_llama_config(tmp_path: Path) -> None:
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    LlamaConfig(vocab_size=len(tok)).save_pretrained(tmp_path)  # what AutoTokenizer consults
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert again.decode(again.encode(text, add_special_tokens=False)) == text  # spaces survive (not Qwen2)
    assert (again.eos_token, again.pad_token, again.padding_side) == (IM_END, "<|pad|>", "left")
    messages = [{"role": "user", "content": "1 + 2 ="}]
    assert again.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(
        messages, tokenize=False
    )
