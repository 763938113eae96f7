"""SGLang 0.5.23's ``sampling_params``: the keys it accepts, its checks and its normalisation.

What it is: ``WireSamplingParams`` (one request's sampling parameters after SGLang's normalisation) and
``parse_sampling_params`` (SGLang's ``SamplingParams.verify`` rules, with its error messages), from
``sglang/srt/sampling/sampling_params.py``. The CPU server parses requests with it; the client sends
plain dicts it accepts.

Beyond SGLang's rules, every number must fit the float32 the sampler computes in (|x| <= FLOAT32_MAX:
a temperature of 1e39 is a finite double but inf in float32, and would make every logprob NaN), and
``stop_token_ids`` must be token ids of the model (``0 <= id < vocab_size`` when the vocabulary is
known; a negative id would silently ban the wrong token, a huge one would fail inside the engine).
Each refusal is an ``InvalidRequestError`` (a 400) naming the field.
What it is not: the ``/generate`` request around it (``rollflow.inference.sglang_protocol``) or a
sampler (the CPU server's engine samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.errors import InvalidRequestError

TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k
SAMPLING_EPS = 1e-6  # temperature below this means greedy (SGLang: top_k=1, temperature=1)
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: the sampler computes in float32
_FLOAT32_WHAT = f"a finite number within float32 range (|x| <= {FLOAT32_MAX:.4g})"
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 on every engine; the bound when the vocabulary is unknown

# sampling_params keys SGLang 0.5.23 accepts (an unknown key is a TypeError there, a 400 here).
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
        "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
        "custom_params", "watermark",
    }
)  # fmt: skip


_bad = InvalidRequestError


def _short(v: Any, limit: int = 80) -> str:
    """``repr(v)`` cut to ``limit`` characters: an error message never echoes a whole hostile body."""
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class WireSamplingParams:
    """``sampling_params`` of one request after SGLang's normalisation (``None`` -> default).

    Greedy: ``0 <= temperature < 1e-6`` becomes ``temperature = 1, top_k = 1`` (``is_greedy`` remembers it),
    and ``top_k = -1`` becomes ``TOP_K_ALL``, exactly as SGLang's ``SamplingParams.__post_init__``.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    min_new_tokens: int = 0
    n: int = 1
    sampling_seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    constrained: bool = False  # json_schema / regex / ebnf / structural_tag / stop_regex given
    is_greedy: bool = False

    def unsupported_features(self) -> list[str]:
        """Names of the non-default features set here (the CPU server rejects these)."""
        out = []
        if self.stop:
            out.append("stop (strings; use stop_token_ids)")
        if self.n != 1:
            out.append("n > 1 (send n requests)")
        if self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0:
            out.append("frequency/presence/repetition penalties")
        if self.logit_bias:
            out.append("logit_bias")
        if self.constrained:
            out.append("constrained decoding (json_schema/regex/ebnf/structural_tag/stop_regex)")
        return out


def is_float32(x: Any) -> bool:
    """A JSON number that is finite in float32 (what the sampler computes in): not NaN, |x| <= FLOAT32_MAX."""
    if is_int(x):
        return abs(x) <= FLOAT32_MAX  # exact for any int; math.isfinite(10**400) raises OverflowError
    return is_number(x) and math.isfinite(x) and abs(x) <= FLOAT32_MAX


def parse_sampling_params(
    raw: Any, *, where: str = "sampling_params", vocab_size: int | None = None
) -> WireSamplingParams:
    """Check one ``sampling_params`` dict with SGLang's rules (``SamplingParams.verify``) and normalise it.

    ``vocab_size``: the served model's vocabulary; ``stop_token_ids`` must lie in ``[0, vocab_size)``.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise _bad(f"{where}: unknown key(s) {unknown}; see docs/inference.md for the accepted keys")

    def typed(key: str, default: Any, ok: Any, what: str) -> Any:
        v = raw.get(key)
        v = default if v is None else v
        if not ok(v):
            raise _bad(f"{where}.{key} must be {what}, got {_short(v)}")
        return v

    def number(key: str, default: float) -> float:
        return float(typed(key, default, is_float32, _FLOAT32_WHAT))

    def integer(key: str, default: int) -> int:
        return int(typed(key, default, is_int, "an integer"))

    def boolean(key: str, default: bool) -> bool:
        return bool(typed(key, default, lambda v: isinstance(v, bool), "true or false"))

    p = WireSamplingParams(
        max_new_tokens=integer("max_new_tokens", 128),
        temperature=number("temperature", 1.0),
        top_p=number("top_p", 1.0),
        top_k=integer("top_k", -1),
        min_p=number("min_p", 0.0),
        ignore_eos=boolean("ignore_eos", False),
        skip_special_tokens=boolean("skip_special_tokens", True),
        min_new_tokens=integer("min_new_tokens", 0),
        n=integer("n", 1),
        frequency_penalty=number("frequency_penalty", 0.0),
        presence_penalty=number("presence_penalty", 0.0),
        repetition_penalty=number("repetition_penalty", 1.0),
    )
    stop = raw.get("stop")
    if stop is not None:
        p.stop = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, list) else []
        if not all(isinstance(s, str) for s in p.stop) or not isinstance(stop, (str, list)):
            raise _bad(f"{where}.stop must be a string or a list of strings")
    ids = raw.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(is_int(t) for t in ids):
            raise _bad(f"{where}.stop_token_ids must be a list of integers, got {_short(ids)}")
        hi = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
        for i, t in enumerate(ids):
            if not 0 <= t < hi:
                bound = f"vocab_size {vocab_size}" if vocab_size is not None else "2**31"
                raise _bad(
                    f"{where}.stop_token_ids[{i}] = {_short(t)} is not a token id of this model; "
                    f"valid range is [0, {bound})."
                )
        p.stop_token_ids = sorted({int(t) for t in ids})
    seed = raw.get("sampling_seed")
    if seed is not None:
        if not is_int(seed):
            raise _bad(f"sampling_seed must be an integer, got {type(seed).__name__}.")
        if not -(2**63) <= seed <= 2**63 - 1:
            raise _bad(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")
        p.sampling_seed = int(seed)
    bias = raw.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(is_float32(v) for v in bias.values()):
            raise _bad(f"{where}.logit_bias must be an object {{token_id: finite float32 number}}")
        p.logit_bias = {str(k): float(v) for k, v in bias.items()}
    p.constrained = any(raw.get(k) for k in ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex"))

    # SGLang's verify(), same messages.
    if p.temperature < 0.0:
        raise _bad(f"temperature must be a non-negative finite number, got {p.temperature}.")
    if not 0.0 < p.top_p <= 1.0:
        raise _bad(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0.0 <= p.min_p <= 1.0:
        raise _bad(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k < 1 and p.top_k != -1:
        raise _bad(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    if p.max_new_tokens < 0:
        raise _bad(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if not 0 <= p.min_new_tokens <= p.max_new_tokens:
        raise _bad(
            f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], got {p.min_new_tokens}."
        )
    if p.n < 1:
        raise _bad(f"n must be at least 1, got {p.n}.")

    # SGLang's __post_init__ normalisation.
    if 0 <= p.temperature < SAMPLING_EPS:
        p.temperature, p.top_k, p.is_greedy = 1.0, 1, True
    if p.top_k == -1:
        p.top_k = TOP_K_ALL
    return p
