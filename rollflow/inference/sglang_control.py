"""SGLang 0.5.23's control routes: weight updates, pause / continue, abort, and its error replies.

What it is: the bodies of ``/update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``),
``/pause_generation`` (``parse_pause_mode``: abort, retract or in_place) and ``/abort_request``
(``parse_abort``), SGLang's success replies, and its error body in all its shapes (``error_message``),
with SGLang's field names, defaults and messages (``sglang/srt/managers/io_struct.py``).
What it is not: I/O (the client's ``routing.control_call`` and the CPU server's app send and serve them)
or ``/generate`` (``rollflow.inference.sglang_protocol``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rollflow.api.errors import InvalidRequestError
from rollflow.inference.sglang_sampling import is_int

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[str, ...] = ("abort", "retract", "in_place")

_bad = InvalidRequestError


_UPDATE_BOOL_KEYS = ("abort_all_requests", "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "flush_cache")  # fmt: skip


@dataclass
class UpdateWeightFromDiskReqInput:
    """Body of ``POST /update_weights_from_disk`` (SGLang's fields and defaults)."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: dict[str, Any] | None = None
    # rollflow's CPU server only (SGLang has no such field): COMMIT.json's ``{"hash", "files"}``; every weight
    # file must match it as it is read, or the update is refused
    commit: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, body: Any) -> UpdateWeightFromDiskReqInput:
        if not isinstance(body, dict):
            raise _bad("request body must be a JSON object")
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise _bad("model_path is required and must be a non-empty string")
        if "\x00" in path:  # no file system takes it; os.path calls would raise ValueError (a 500)
            raise _bad("model_path must not contain a NUL byte (\\x00)")
        out = cls(model_path=path)
        for key in _UPDATE_BOOL_KEYS:
            v = body.get(key)
            if v is not None:
                if not isinstance(v, bool):
                    raise _bad(f"{key} must be true or false, got {v!r}")
                setattr(out, key, v)
        for key in ("load_format", "weight_version"):
            v = body.get(key)
            if v is not None:
                if not isinstance(v, str):
                    raise _bad(f'{key} must be a string, got {v!r} (weight_version is a string: "7", not 7)')
                setattr(out, key, v)
        if body.get("token_step") is not None:
            if not is_int(body["token_step"]):
                raise _bad("token_step must be an integer")
            out.token_step = int(body["token_step"])
        if body.get("commit") is not None:
            out.commit = _parse_commit(body["commit"])
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_path": self.model_path, "abort_all_requests": self.abort_all_requests}
        if self.weight_version is not None:
            out["weight_version"] = self.weight_version
        if self.load_format is not None:
            out["load_format"] = self.load_format
        out["flush_cache"] = self.flush_cache  # always explicit: its right value depends on the pause mode
        if self.keep_pause:
            out["keep_pause"] = True
        if self.commit is not None:
            out["commit"] = self.commit
        return out


def _parse_commit(v: Any) -> dict[str, Any]:
    """``{"hash": str, "files": {name: {"size": int >= 0, <hash>: str}}}``, else InvalidRequestError."""
    ok = isinstance(v, dict) and isinstance(v.get("hash"), str) and isinstance(v.get("files"), dict)
    algo = v.get("hash") if ok else None
    files = v.get("files") if ok else None
    if not ok or not all(
        isinstance(n, str) and isinstance(e, dict) and is_int(e.get("size")) and e["size"] >= 0
        and isinstance(e.get(algo), str)
        for n, e in files.items()
    ):  # fmt: skip
        raise _bad('commit must be {"hash": algo, "files": {name: {"size": int, algo: hex digest}}}')
    return {"hash": algo, "files": files}


def update_weights_message(weight_version: str | None) -> str:
    """SGLang's success message of ``/update_weights_from_disk``."""
    msg = "Succeeded to update model weights."
    return msg + (f" Weight version updated to {weight_version}." if weight_version is not None else "")


def parse_pause_mode(body: Any) -> PauseMode:
    """Body of ``/pause_generation``: ``{"mode": "abort"|"retract"|"in_place"}``, default abort."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    mode = body.get("mode") or "abort"
    if mode not in PAUSE_MODES:
        raise _bad(f"mode must be one of {list(PAUSE_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def parse_abort(body: Any) -> tuple[str, bool]:
    """Body of ``/abort_request``: ``{"rid": str = "", "abort_all": bool = false}`` -> ``(rid, abort_all)``."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    rid = body.get("rid") or ""
    abort_all = body.get("abort_all") or False
    if not isinstance(rid, str) or not isinstance(abort_all, bool):
        raise _bad("rid must be a string and abort_all true or false")
    return rid, abort_all


# SGLang 0.5.23's reply when the weights were swapped but the cache could not be flushed (requests still
# running or queued, as under an ``in_place`` pause): status 400, yet the new weights ARE live and the
# scheduler tags new tokens with the new version; only ``/model_info`` keeps the old one.
NOT_FLUSHED_PREFIX = "Weights were updated, but the cache was not flushed"
NOT_FLUSHED_MESSAGE = (
    f"{NOT_FLUSHED_PREFIX} because requests are still running or queued. Retract or finish them, then call "
    "/flush_cache."
)


def update_was_applied(message: str) -> bool:
    """True when a refused ``/update_weights_from_disk`` reply says the weights were swapped anyway."""
    return message.startswith(NOT_FLUSHED_PREFIX)


def parse_weight_version_update(body: Any) -> tuple[str, bool]:
    """Body of ``/update_weight_version``: ``{"new_version": str, "abort_all_requests": bool = true}``."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    new = body.get("new_version")
    abort_all = body.get("abort_all_requests", True)
    if not isinstance(new, str) or not new:
        raise _bad('new_version is required and must be a non-empty string ("7", not 7)')
    if not isinstance(abort_all, bool):
        raise _bad("abort_all_requests must be true or false")
    return new, abort_all


PAUSE_OK = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUE_OK = {"message": "Generation continued successfully.", "status": "ok"}
FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)


def error_body(message: str) -> dict[str, Any]:
    """SGLang's generic error reply ``{"error": {"message": ...}}``."""
    return {"error": {"message": message}}


def error_message(body: Any) -> str:
    """The human message of an SGLang error reply (any of its shapes), else the body as text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]
