"""The tokenizer view workflows and the agent endpoint use: ``ChatTokenizer``.

What it is: the part of a Hugging Face tokenizer that rollflow's rollout side touches: the chat template
(``apply_chat_template(..., tokenize=False)``), ``encode`` without special tokens, ``decode``, and the
special token ids (a model's end-of-turn token). Any object with these members works in a test.

What it is not: a tokenizer; loading one is ``rollflow.workflows.blocks.load_tokenizer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the workflows and the agent endpoint use."""

    chat_template: Any
    all_special_ids: list[int]

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...
