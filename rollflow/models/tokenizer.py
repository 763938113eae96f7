"""The tiny model's tokenizer: per-character WordLevel, built locally with `tokenizers`.

What it is: a deterministic vocabulary of 104 tokens - four specials (``<|pad|>``, ``<|unk|>``,
``<|im_start|>``, ``<|im_end|>``), the three chat role names as whole tokens (so a rendered chat
turn costs 3 tokens of framing instead of 13), and one token per printable ASCII character plus
newline and tab. Any other character maps to ``<|unk|>``. The chat template is ChatML
(``<|im_start|>{role}\\n{content}<|im_end|>\\n``), and ``<|im_end|>`` is the EOS token, so a
completion ends where a chat turn ends.

What it is not: a general-purpose tokenizer. It is for the embedded default and tests, where no
model hub can be reached. It is wrapped as ``PreTrainedTokenizerFast`` so that
``AutoTokenizer.from_pretrained`` (transformers, SGLang) loads it back unchanged - provided the model
config says ``llama``: under ``qwen2`` AutoTokenizer swaps in a class that drops spaces
(see notes/stack.md section 6).

Usage::

    tok = build_tokenizer()
    ids = tok.apply_chat_template([{"role": "user", "content": "12+35="}], add_generation_prompt=True)
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, IM_START, IM_END)
ROLE_TOKENS: tuple[str, ...] = ("system", "user", "assistant")
CHARACTERS: tuple[str, ...] = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")

# ChatML. ``add_generation_prompt`` opens the assistant turn; the model closes it with <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer_vocab() -> dict[str, int]:
    """The fixed vocabulary: specials first (pad = 0), then role names, then characters."""
    tokens = list(SPECIAL_TOKENS) + list(ROLE_TOKENS) + list(CHARACTERS)
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer(*, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """Build the per-character chat tokenizer.

    Args:
        model_max_length: recorded in the saved tokenizer config; match the model's
            ``max_position_embeddings``.

    Returns:
        A ``PreTrainedTokenizerFast`` with pad/eos/unk set (eos = ``<|im_end|>``), no BOS, and the
        ChatML chat template. ``decode(encode(s)) == s`` for any printable-ASCII string.
    """
    vocab = tokenizer_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split("", "isolated") cuts between every pair of characters; Fuse glues them back on decode.
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    # Role names are plain added tokens: matched before the per-character split, decoded as text.
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
