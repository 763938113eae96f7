"""SGLang 0.5.23's native HTTP protocol, the subset an RL loop uses: request/response shapes and their checks.

What it is: plain dataclasses and parse/build functions for ``/generate``, ``/update_weights_from_disk``,
``/pause_generation``, ``/continue_generation`` and ``/abort_request``, with SGLang's field names,
defaults and error messages (source: ``sglang/srt/managers/io_struct.py``,
``sglang/srt/sampling/sampling_params.py``, ``sglang/srt/utils/weight_versions.py``). Both sides use it:
the CPU server (``infra.cpu_server``) parses requests with it, the client (``rollflow.inference.client``)
builds requests and reads replies with it. docs/inference.md shows the exact payloads. This module holds
``/generate`` and re-exports the rest, so one import path names the whole protocol: the sampling
parameters are ``rollflow.inference.sglang_sampling``, the control routes ``rollflow.inference.sglang_control``.

What it is not: no I/O, no HTTP, no model. Which optional SGLang features the CPU server implements is
decided in ``infra.cpu_server.app``, not here; this module parses the full field set it names.

Example::

    items = parse_generate_request({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}, vocab_size=64)
    items[0].sampling.max_new_tokens  # 4
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.errors import InvalidRequestError
from rollflow.inference.sglang_control import (
    CONTINUE_OK,
    FLUSH_OK_TEXT,
    NOT_FLUSHED_MESSAGE,
    PAUSE_MODES,
    PAUSE_OK,
    PauseMode,
    UpdateWeightFromDiskReqInput,
    error_body,
    error_message,
    parse_abort,
    parse_pause_mode,
    parse_weight_version_update,
    update_was_applied,
    update_weights_message,
)
from rollflow.inference.sglang_sampling import (
    SAMPLING_EPS,
    SAMPLING_KEYS,
    TOP_K_ALL,
    WireSamplingParams,
    is_int,
    parse_sampling_params,
)

# One import path for the whole protocol: the sampling parameters and the control routes are modules of
# their own (rollflow.inference.sglang_sampling, rollflow.inference.sglang_control).
__all__ = [
    "CONTINUE_OK",
    "DEFAULT_WEIGHT_VERSION",
    "FLUSH_OK_TEXT",
    "NOT_FLUSHED_MESSAGE",
    "PAUSE_MODES",
    "PAUSE_OK",
    "PROTOCOL_VERSION",
    "ROUTE_ABORT",
    "ROUTE_CONTINUE",
    "ROUTE_FLUSH_CACHE",
    "ROUTE_GENERATE",
    "ROUTE_HEALTH",
    "ROUTE_HEALTH_GENERATE",
    "ROUTE_MODEL_INFO",
    "ROUTE_UPDATE_WEIGHT_VERSION",
    "ROUTE_PAUSE",
    "ROUTE_SERVER_INFO",
    "ROUTE_UPDATE_WEIGHTS",
    "SAMPLING_EPS",
    "SAMPLING_KEYS",
    "TOP_K_ALL",
    "GenerateItem",
    "GenerateOutput",
    "PauseMode",
    "UpdateWeightFromDiskReqInput",
    "WeightVersionSpan",
    "WireSamplingParams",
    "build_generate_payload",
    "check_context",
    "compute_weight_version_spans",
    "error_body",
    "error_message",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "parse_abort",
    "parse_generate_request",
    "parse_generate_response",
    "parse_pause_mode",
    "parse_weight_version_update",
    "parse_sampling_params",
    "token_versions_from_meta",
    "update_was_applied",
    "update_weights_message",
]

PROTOCOL_VERSION = "0.5.23"  # the SGLang release whose HTTP API this module follows
DEFAULT_WEIGHT_VERSION = "default"  # SGLang's --weight-version default

# Control routes (POST unless noted).
ROUTE_GENERATE = "/generate"
ROUTE_PAUSE = "/pause_generation"
ROUTE_CONTINUE = "/continue_generation"
ROUTE_ABORT = "/abort_request"
ROUTE_UPDATE_WEIGHTS = "/update_weights_from_disk"
ROUTE_FLUSH_CACHE = "/flush_cache"  # GET or POST
ROUTE_HEALTH = "/health"  # GET
ROUTE_HEALTH_GENERATE = "/health_generate"  # GET
ROUTE_MODEL_INFO = "/model_info"  # GET (``/get_model_info`` is its deprecated alias in 0.5.23)
ROUTE_SERVER_INFO = "/server_info"  # GET (``/get_server_info`` is its deprecated alias in 0.5.23)
ROUTE_UPDATE_WEIGHT_VERSION = "/update_weight_version"

_bad = InvalidRequestError


# --- /generate request -----------------------------------------------------------------------------------------


@dataclass
class GenerateItem:
    """One prompt of a (possibly batched) ``/generate`` request, normalised."""

    rid: str
    input_ids: list[int] | None
    text: str | None
    sampling: WireSamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False


def _check_ids(ids: Any, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(ids, list):
        raise _bad(f"{where} must be a list of integer token ids, got {type(ids).__name__}")
    if not ids:
        raise _bad(f"{where} must not be empty")
    for i, t in enumerate(ids):
        if not is_int(t):
            raise _bad(f"{where}[{i}] must be an integer token id, got {t!r}")
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            hi = f"{vocab_size}" if vocab_size is not None else "vocab_size"
            raise _bad(f"{where}[{i}] = {t} is outside the vocabulary; valid range is [0, {hi}).")
    return [int(t) for t in ids]


def parse_generate_request(
    body: Any, *, vocab_size: int | None = None, context_len: int | None = None
) -> tuple[list[GenerateItem], bool]:
    """Parse a ``/generate`` body into one item per prompt; returns ``(items, is_batch)``.

    Unknown top-level keys are ignored (as in SGLang). Raises ``InvalidRequestError`` with SGLang's
    message where SGLang has one (e.g. "text and input_ids cannot be provided at the same time").
    A string ``rid`` on a batch becomes the prefix ``f"{rid}_{i}"``; no rid gets a uuid4 hex.
    """
    if not isinstance(body, dict):
        raise _bad(f"request body must be a JSON object, got {type(body).__name__}")
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None and ids is not None:
        raise _bad("text and input_ids cannot be provided at the same time")
    if text is None and ids is None:
        raise _bad("Either text, input_ids or input_embeds should be provided.")
    if ids is not None:
        is_batch = isinstance(ids, list) and len(ids) > 0 and isinstance(ids[0], list)
        if is_batch:
            prompts: list[Any] = [_check_ids(x, f"input_ids[{i}]", vocab_size) for i, x in enumerate(ids)]
        else:
            prompts = [_check_ids(ids, "input_ids", vocab_size)]
    else:
        is_batch = isinstance(text, list)
        prompts = list(text) if is_batch else [text]
        if not prompts or not all(isinstance(t, str) and t for t in prompts):
            raise _bad("text must be a non-empty string or a non-empty list of non-empty strings")
    n = len(prompts)

    rid = body.get("rid")
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    elif isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(n)] if is_batch else [rid]
    elif isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        if len(rid) != n:
            raise _bad("The specified rids length mismatch with the batch_size for batch processing.")
        rids = list(rid)
    else:
        raise _bad("The rid should be a string or a list of strings.")
    if any(not r for r in rids):
        raise _bad("rid must not be an empty string")

    raw_sp = body.get("sampling_params")
    if isinstance(raw_sp, list):
        if len(raw_sp) != n:
            raise _bad(f"sampling_params has {len(raw_sp)} entries for {n} prompts")
        sps = [
            parse_sampling_params(s, where=f"sampling_params[{i}]", vocab_size=vocab_size)
            for i, s in enumerate(raw_sp)
        ]
    else:
        sp = parse_sampling_params(raw_sp, vocab_size=vocab_size)
        sps = [sp] * n

    def per_item(key: str, default: Any, check: Any, what: str) -> list[Any]:
        v = body.get(key)
        vals = v if isinstance(v, list) else [v] * n
        if len(vals) != n:
            raise _bad(f"{key} has {len(vals)} entries for {n} prompts")
        out = []
        for x in vals:
            x = default if x is None else x
            if not check(x):
                raise _bad(f"{key} must be {what}, got {x!r}")
            out.append(x)
        return out

    ret_lp = per_item("return_logprob", False, lambda x: isinstance(x, bool), "true or false")
    start = per_item("logprob_start_len", -1, is_int, "an integer")
    top_n = per_item("top_logprobs_num", 0, lambda x: is_int(x) and x >= 0, "an integer >= 0")
    ret_text = body.get("return_text_in_logprobs") or False
    stream = body.get("stream") or False
    if not isinstance(ret_text, bool) or not isinstance(stream, bool):
        raise _bad("return_text_in_logprobs and stream must be true or false")

    items = [
        GenerateItem(
            rids[i],
            prompts[i] if ids is not None else None,
            prompts[i] if ids is None else None,
            sps[i],
            ret_lp[i],
            start[i],
            top_n[i],
            ret_text,
            stream,
        )  # fmt: skip
        for i in range(n)
    ]
    for it in items:
        if it.input_ids is not None and context_len is not None:
            check_context(len(it.input_ids), it.sampling.max_new_tokens, context_len)
    return items, is_batch


def check_context(n_input: int, max_new_tokens: int, context_len: int) -> None:
    """SGLang's context-length checks (tokenizer_manager ``_validate_one_request``), same messages."""
    if n_input >= context_len:
        raise _bad(
            f"The input ({n_input} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if n_input + max_new_tokens > context_len:
        raise _bad(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {n_input + max_new_tokens} tokens: {n_input} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit."
        )


def build_generate_payload(
    input_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    stop_token_ids: list[int] | None = None,
    ignore_eos: bool = False,
    skip_special_tokens: bool = True,
    sampling_seed: int | None = None,
    rid: str | None = None,
    return_logprob: bool = True,
) -> dict[str, Any]:
    """The JSON body of one non-streamed ``/generate`` call (what the client sends)."""
    sp: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "ignore_eos": ignore_eos,
        "skip_special_tokens": skip_special_tokens,
    }
    if stop_token_ids:
        sp["stop_token_ids"] = list(stop_token_ids)
    if sampling_seed is not None:
        sp["sampling_seed"] = sampling_seed
    body: dict[str, Any] = {
        "input_ids": list(input_ids),
        "sampling_params": sp,
        "return_logprob": return_logprob,
    }
    if rid is not None:
        body["rid"] = rid
    return body


# --- /generate response ----------------------------------------------------------------------------------------


def finish_stop(matched: int | str) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(
    message: str = "Aborted", status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


@dataclass
class WeightVersionSpan:
    """Output tokens ``[start, end)`` were produced under weights ``version``."""

    version: str
    start: int
    end: int


def compute_weight_version_spans(
    events: list[tuple[str, int]], current_version: str, num_output_tokens: int
) -> list[WeightVersionSpan]:
    """SGLang's ``compute_weight_version_spans``.

    ``events`` are ``(old_version, n_output_tokens_at_the_change)`` in order; tokens after the last event
    belong to ``current_version``. Worked example: events ``[("3", 5)]``, current ``"4"``, 8 tokens ->
    ``[("3", 0, 5), ("4", 5, 8)]``. Adjacent equal versions merge; empty spans vanish.
    """
    changes = [*events, (current_version, num_output_tokens)]
    spans: list[WeightVersionSpan] = []
    for version, end in changes:
        end = min(end, num_output_tokens)
        if spans and end <= spans[-1].end:
            continue
        if spans and version == spans[-1].version:
            spans[-1].end = end
            continue
        start = spans[-1].end if spans else 0
        spans.append(WeightVersionSpan(version=version, start=start, end=end))
    if not spans:  # no output tokens: SGLang keeps the zero-length first span
        spans.append(WeightVersionSpan(version=current_version, start=0, end=0))
    return spans


@dataclass
class GenerateOutput:
    """One non-streamed ``/generate`` reply, as the client reads it."""

    rid: str
    text: str
    output_ids: list[int]
    finish_reason: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    weight_version: str
    output_token_logprobs: list[float] | None  # None if return_logprob was false
    token_versions: list[str]  # weight version of each output token (from weight_versions spans)
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def finish_type(self) -> str:
        return str(self.finish_reason.get("type", ""))


def token_versions_from_meta(meta: dict[str, Any], n_tokens: int) -> list[str]:
    """Per-output-token weight version: from ``weight_versions`` spans, else ``weight_version`` for all."""
    fallback = str(meta.get("weight_version", DEFAULT_WEIGHT_VERSION))
    out = [fallback] * n_tokens
    for span in meta.get("weight_versions") or []:
        v = str(span["version"])
        for i in range(max(0, int(span["start"])), min(n_tokens, int(span["end"]))):
            out[i] = v
    return out


def parse_generate_response(obj: Any) -> GenerateOutput:
    """Read one ``/generate`` reply object; raises ``InvalidRequestError`` if it is not one."""
    if not isinstance(obj, dict) or "meta_info" not in obj or "output_ids" not in obj:
        raise _bad(f"not a /generate reply: {str(obj)[:200]}")
    meta = obj["meta_info"]
    ids = [int(t) for t in obj["output_ids"]]
    lps = meta.get("output_token_logprobs")
    logprobs = None
    if lps is not None:
        logprobs = [float(x[0]) if x[0] is not None else float("nan") for x in lps]
        if len(logprobs) != len(ids):
            raise _bad(f"reply has {len(ids)} output_ids but {len(logprobs)} output_token_logprobs")
    return GenerateOutput(
        rid=str(meta.get("id", "")),
        text=str(obj.get("text", "")),
        output_ids=ids,
        finish_reason=dict(meta.get("finish_reason") or {}),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(ids))),
        weight_version=str(meta.get("weight_version", DEFAULT_WEIGHT_VERSION)),
        output_token_logprobs=logprobs,
        token_versions=token_versions_from_meta(meta, len(ids)),
        raw=obj,
    )
