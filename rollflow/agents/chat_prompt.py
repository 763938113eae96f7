"""Prompt token ids of an agent's chat call: the exact previous context plus the template's new text.

What it is. The first call of a conversation is rendered with the tokenizer's chat template
(``add_generation_prompt=True``, ``tools`` as ``rollflow.agents.tool_calls`` says) and tokenized. A
later call whose messages are the previous call's messages, then the assistant message the endpoint
returned, then new messages (tool results, a user turn) is **not** re-tokenized:

    prompt_ids(call k) = prompt_ids(call k-1) + completion_ids(call k-1) + delta_ids

where ``delta_ids`` tokenizes only the template's text after the assistant's content: the closing of
the assistant turn, the new messages, the next generation prompt. The delta is found by rendering the
conversation with a sentinel as the assistant's content and taking what follows it (the template's
own rendering of the earlier turns never matters, nor how it would render the model's tool calls).

End of turn vs EOS. The endpoint adds the template's end-of-turn token (the first special token after
an assistant's content: ``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3) to the stop tokens, so the
model stops where the template closes its turn. When the completion ends with the token the delta
begins with, the delta starts after it: the model's token stays, with its logprob, and is trained
(the model learns to end its turn). When it ended otherwise (the length cap, or an EOS the template does
not write there, say ``<|endoftext|>`` before ``<|im_end|>``), the template's closing follows the
model's last token, so the sequence still extends the previous one.

Anything else (the agent edited, dropped or reordered earlier messages, changed ``tools``, or changed
the assistant's reply) is rendered whole and tokenized; its ids rarely extend the previous context,
and then the call starts a new segment (``rollflow.agents.recorder``).

What it is not: no HTTP and no recording; the per-token bookkeeping is the recorder's.
"""

from __future__ import annotations

import json
from typing import Any

from rollflow.agents.openai_protocol import Message
from rollflow.agents.tool_calls import ToolFormat, normalized, template_messages
from rollflow.api.errors import AgentRequestError
from rollflow.api.tokenizer import ChatTokenizer

_SENTINEL = "\u2063ROLLFLOW-AGENT-TURN\u2063"


class ChatPrompter:
    """Renders and tokenizes chat calls for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: ChatTokenizer, *, tool_format: ToolFormat = "hermes") -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(
                "the tokenizer has no chat_template; the agent endpoint needs one for /v1/chat/completions"
            )
        self.tokenizer = tokenizer
        self.tool_format: ToolFormat = tool_format
        self.template_has_tools = "tools" in (template if isinstance(template, str) else str(template))
        self.special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))
        self.end_of_turn_id = self._find_end_of_turn()

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's text for ``messages`` (OpenAI form) and ``tools``."""
        convo = template_messages(
            messages, tools, template_has_tools=self.template_has_tools, fmt=self.tool_format
        )
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools and self.template_has_tools:
            kwargs["tools"] = tools
        try:
            text = self.tokenizer.apply_chat_template(convo, **kwargs)
        except Exception as exc:  # jinja raises for conversations the template refuses (role order, ...)
            raise AgentRequestError(
                f"the chat template refused the messages: {exc}", param="messages", code="template_error"
            ) from None
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def full_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        """The whole conversation rendered and tokenized (a first call, or a rewritten history)."""
        return self.encode(self.render(messages, tools))

    def delta_ids(
        self,
        previous: list[Message],
        previous_tools: list[dict[str, Any]] | None,
        reply: Message,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        last_token: int | None,
    ) -> list[int] | None:
        """Ids that follow the previous context for ``messages``, or None when they do not continue it.

        ``previous`` were the previous call's messages and ``reply`` the assistant message returned for
        it; ``messages`` continue them when they start with ``previous + [reply]``, add something and
        come with the same ``tools``.
        """
        if json.dumps(previous_tools, sort_keys=True) != json.dumps(tools, sort_keys=True):
            return None
        k = len(previous)
        if len(messages) <= k + 1:
            return None
        if [normalized(m) for m in messages[:k]] != [normalized(m) for m in previous]:
            return None
        if normalized(messages[k]) != normalized(reply):
            return None
        convo = [*messages[:k], {"role": "assistant", "content": _SENTINEL}, *messages[k + 1 :]]
        text = self.render(convo, tools)
        if text.count(_SENTINEL) != 1:
            return None  # the template drops or repeats the assistant's content: render whole
        after = text.split(_SENTINEL, 1)[1]
        if last_token is not None and last_token in self.special_ids:
            closing = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if closing and after.startswith(closing):
                after = after[len(closing) :]
        return self.encode(after)

    def _find_end_of_turn(self) -> int | None:
        """The first special token the template writes after an assistant's content, if any."""
        convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.render(convo, None, add_generation_prompt=False)
        except AgentRequestError:
            return None
        if _SENTINEL not in text:
            return None
        ids = self.encode(text.split(_SENTINEL, 1)[1])
        return ids[0] if ids and ids[0] in self.special_ids else None
