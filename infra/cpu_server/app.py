"""The CPU server's HTTP layer: SGLang 0.5.23's native routes over aiohttp, in front of ``engine.Engine``.

What it is: request parsing and checking (with ``rollflow.inference.sglang_protocol``), the pause gate (while
paused, new ``/generate`` calls wait instead of failing), API-key auth (``Authorization: Bearer``; the
``/health*`` routes stay open as in SGLang, for probes), JSON error replies, and clean shutdown on
SIGTERM/SIGINT (in-flight requests return their partial output with ``finish_reason`` abort).

Routes: ``/generate``, ``/pause_generation``, ``/continue_generation``, ``/abort_request``,
``/update_weights_from_disk``, ``/flush_cache``, ``/health``, ``/health_generate``, ``/get_model_info``,
``/get_server_info``, ``/model_info``, ``/server_info``, ``/update_weight_version`` (payloads in
docs/inference.md).

``/update_weights_from_disk`` also takes a LoRA adapter directory (peft's adapter_config.json +
adapter_model.safetensors): it is checked against the base the server started from and merged into a
copy of it (``adapters.py``), then swapped in like a full checkpoint.

What it is not: no model math (``engine.py``, ``sampling.py``), no weight checks (``weights.py``), no CLI
(``__main__.py``). SGLang features the CPU server does not implement (stop strings, n > 1, penalties,
constrained decoding, streaming, input/top logprobs) are refused with a 400 that names them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from infra.cpu_server.adapters import is_adapter_dir, load_checked_adapter
from infra.cpu_server.engine import Engine, EngineConfig, Sequence
from infra.cpu_server.weights import WeightLoadError, load_checked_weights, read_config
from rollflow.api.errors import InvalidRequestError
from rollflow.inference.refusal_log import OncePerClientFilter, RefusalLog
from rollflow.inference.sglang_protocol import (
    CONTINUE_OK,
    FLUSH_OK_TEXT,
    NOT_FLUSHED_MESSAGE,
    PAUSE_OK,
    PROTOCOL_VERSION,
    UpdateWeightFromDiskReqInput,
    WireSamplingParams,
    check_context,
    error_body,
    parse_abort,
    parse_generate_request,
    parse_pause_mode,
    parse_weight_version_update,
    update_weights_message,
)

logger = logging.getLogger(__name__)
# aiohttp's own log (malformed HTTP: "Error handling request from <peer>" + a traceback, per request),
# at most once per client per minute so an unauthenticated caller cannot flood the log.
http_logger = logging.getLogger("infra.cpu_server.http")
http_logger.addFilter(OncePerClientFilter())


MAX_CHARS_PER_TOKEN = 64  # a text longer than this many characters per context token cannot fit it


def _strict_dumps(obj: Any) -> str:
    """JSON with no bare NaN / Infinity (not JSON; clients choke on it): such a value is a server bug."""
    return json.dumps(obj, allow_nan=False)


def _reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_strict_dumps)


@dataclass
class ServerArgs:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    max_batch_size: int = 64
    threads: int = 1
    weight_version: str = "default"
    dtype: str = "float32"
    context_length: int | None = None
    max_prefill_tokens: int = 8192
    seed: int | None = None
    served_model_name: str | None = None
    batch_window_ms: float = 3.0
    # Directories /update_weights_from_disk may load from (realpath-checked); empty = any readable one.
    weights_roots: tuple[str, ...] = ()
    max_lora_rank: int | None = None  # LoRA adapters above this rank are refused (None: any rank)


class ServerState:
    """The loaded model, its tokenizer (optional) and the engine; built once per process."""

    def __init__(self, args: ServerArgs) -> None:
        from transformers import AutoModelForCausalLM

        self.args = args
        self.started_at = time.time()
        t0 = time.perf_counter()
        self.served_config = read_config(Path(args.model_path))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype, attn_implementation="sdpa")
        self.tokenizer = _load_tokenizer(args.model_path)
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.context_len = int(args.context_length or getattr(cfg, "max_position_embeddings", 4096))
        self.engine = Engine(
            model,
            EngineConfig(
                context_len=self.context_len,
                eos_token_ids=_eos_ids(model, self.tokenizer),
                max_batch_size=args.max_batch_size,
                max_prefill_tokens=args.max_prefill_tokens,
                weight_version=args.weight_version,
                seed=args.seed,
                batch_window_s=args.batch_window_ms / 1000.0,
            ),
            detokenize=self._detokenize if self.tokenizer is not None else None,
        )
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.update_lock = asyncio.Lock()
        self.shutting_down = False
        self.model_path = args.model_path  # the served checkpoint; follows successful updates (SGLang)
        # The version /model_info reports: SGLang's tokenizer-side copy, which follows successful updates and
        # /update_weight_version only (a swap refused for its flush leaves it behind the engine's).
        self.reported_version = args.weight_version
        # The weights the server started from, which LoRA adapters merge into: the live tensors themselves
        # (a swap re-points parameters and never writes into them). Dropped once full weights are loaded.
        self.base_weights: dict[str, torch.Tensor] | None = {n: p.data for n, p in model.named_parameters()}
        logger.info(
            "loaded %s in %.2fs (context %d)", args.model_path, time.perf_counter() - t0, self.context_len
        )

    def _detokenize(self, ids: list[int], skip_special: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special))


def _load_tokenizer(path: str) -> Any:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # a weights-only directory still serves input_ids
        logger.warning("no tokenizer in %s (%s); text in/out is disabled", path, e)
        return None


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> tuple[int, ...]:
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return ()


# --- helpers ---------------------------------------------------------------------------------------------------


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"malformed JSON body: {e}") from e
    except RecursionError:  # e.g. 100,000 nested brackets: the client's fault, not a server error (500)
        raise InvalidRequestError("malformed JSON body: nested too deeply") from None


def outside_weights_roots(model_path: str, roots: tuple[str, ...]) -> str | None:
    """Why ``model_path`` may not be loaded, or None when it lies under one of ``roots`` (or none is set).

    Paths are compared after ``os.path.realpath``, so ``..`` and symlinks cannot leave a root.
    """
    if not roots:
        return None
    real = os.path.realpath(model_path)
    for root in roots:
        root_real = os.path.realpath(root)
        if real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep):
            return None
    return (
        f"{model_path!r} is outside the weights roots this server may load from ({', '.join(roots)}); "
        "publish checkpoints under one of them or start the server with another --weights-root"
    )


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: dict[str, Any]) -> None:
    def set_it() -> None:
        if not fut.done():
            fut.set_result(result)

    loop.call_soon_threadsafe(set_it)


def _unsupported(sp: WireSamplingParams, item: Any) -> list[str]:
    out = sp.unsupported_features()
    if item.stream:
        out.append("stream")
    if item.logprob_start_len >= 0:
        out.append("logprob_start_len >= 0 (input logprobs)")
    if item.top_logprobs_num > 0:
        out.append("top_logprobs_num")
    return out


# --- routes ----------------------------------------------------------------------------------------------------


def build_app(state: ServerState) -> web.Application:
    engine = state.engine
    api_key = state.args.api_key
    refusals = RefusalLog(logger)  # one WARNING per client per minute: a caller cannot flood the log

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        client = request.remote or "unknown"
        if api_key and not request.path.startswith("/health"):
            auth = request.headers.get("Authorization", "")
            scheme, _, token = auth.partition(" ")
            # aiohttp decodes header bytes as UTF-8 with surrogateescape; encoding back the same way
            # compares the bytes the client sent, and non-UTF-8 bytes are a wrong key, not a 500.
            sent = token.encode("utf-8", "surrogateescape")
            if scheme.lower() != "bearer" or not secrets.compare_digest(sent, api_key.encode()):
                refusals.refused(client, f"401 on {request.method} {request.path}: missing or wrong API key")
                return _reply({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except InvalidRequestError as e:
            refusals.refused(client, f"400 on {request.method} {request.path}: {e}")
            return _reply(error_body(str(e)), status=400)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return _reply(error_body(f"{e.reason}: {request.method} {request.path}"), status=e.status)
        except Exception as e:
            logger.exception("unhandled error on %s", request.path)
            return _reply(error_body(f"internal error: {type(e).__name__}: {e}"), status=500)

    async def generate(request: web.Request) -> web.Response:
        body = await _json_body(request)
        items, is_batch = parse_generate_request(
            body, vocab_size=state.vocab_size, context_len=state.context_len
        )
        prompts: list[list[int]] = []
        for it in items:
            bad = _unsupported(it.sampling, it)
            if bad:
                raise InvalidRequestError(f"not supported by rollflow's CPU server: {', '.join(bad)}")
            if it.input_ids is None:
                if state.tokenizer is None:
                    raise InvalidRequestError("this server has no tokenizer; send input_ids instead of text")
                text = str(it.text)
                if len(text) > MAX_CHARS_PER_TOKEN * state.context_len:  # refused before tokenizing
                    raise InvalidRequestError(
                        f"text has {len(text)} characters; at most {MAX_CHARS_PER_TOKEN} per token of the "
                        f"model's context length ({state.context_len} tokens) could fit"
                    )
                # off the event loop: a long text delays only its own request, never /health or the others
                ids = list(await asyncio.to_thread(state.tokenizer.encode, text))
                check_context(len(ids), it.sampling.max_new_tokens, state.context_len)
                prompts.append(ids)
            else:
                prompts.append(it.input_ids)
        await state.unpaused.wait()  # paused: wait (SGLang blocks new requests until continue_generation)
        if state.shutting_down:
            return _reply(error_body("server is shutting down"), status=503)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for it, ids in zip(items, prompts, strict=True):
            fut: asyncio.Future[Any] = loop.create_future()
            engine.submit(
                Sequence(
                    rid=it.rid,
                    prompt=ids,
                    sp=it.sampling,
                    on_done=partial(_resolve, loop, fut),
                    return_logprob=it.return_logprob,
                    return_text_in_logprobs=it.return_text_in_logprobs,
                )
            )
            futures.append(fut)
        try:
            results = await asyncio.gather(*futures)
        except asyncio.CancelledError:  # the client went away: free its slots
            for it in items:
                engine.abort(it.rid)
            raise
        for r in results:  # SGLang: an abort carrying an HTTP status (e.g. an engine error) is an HTTP error
            code = (r["meta_info"]["finish_reason"] or {}).get("status_code")
            if isinstance(code, int) and 400 <= code < 600:
                return _reply(error_body(r["meta_info"]["finish_reason"]["message"]), status=code)
        return _reply(results if is_batch else results[0])

    async def pause_generation(request: web.Request) -> web.Response:
        mode = parse_pause_mode(await _json_body(request))
        state.unpaused.clear()
        await asyncio.wrap_future(engine.pause(mode))
        return _reply(PAUSE_OK)

    async def continue_generation(request: web.Request) -> web.Response:
        await _json_body(request)
        await asyncio.wrap_future(engine.resume())
        state.unpaused.set()
        return _reply(CONTINUE_OK)

    async def abort_request(request: web.Request) -> web.Response:
        rid, abort_all = parse_abort(await _json_body(request))
        if rid or abort_all:
            await asyncio.wrap_future(engine.abort(rid, abort_all))
        return web.Response(status=200)

    async def update_weights_from_disk(request: web.Request) -> web.Response:
        req = UpdateWeightFromDiskReqInput.from_json(await _json_body(request))
        try:
            os.fsencode(req.model_path)
        except UnicodeEncodeError:  # a lone surrogate from JSON "\ud800": no file has that name
            raise InvalidRequestError(
                "model_path is not a valid file name (unencodable characters)"
            ) from None
        refused = outside_weights_roots(req.model_path, state.args.weights_roots)
        if refused is not None:
            logger.warning("weight update refused: %s", refused)
            return _reply(
                {
                    "success": False,
                    "message": f"Failed to get weights iterator: {refused}",
                    "num_paused_requests": 0,
                },
                status=400,
            )
        async with state.update_lock:
            t0 = time.perf_counter()
            adapter = is_adapter_dir(req.model_path)
            try:
                if adapter and req.commit is not None:
                    raise WeightLoadError(
                        "a LoRA adapter is verified before the load; send no commit with it"
                    )
                if adapter and state.base_weights is None:
                    raise WeightLoadError(
                        "a LoRA adapter merges into the base model this server started from, and the "
                        "server has loaded full weights since; restart it from the adapter's base model"
                    )
                if adapter:
                    load = partial(
                        load_checked_adapter,
                        engine.model,
                        state.base_weights,  # type: ignore[arg-type]
                        req.model_path,
                        max_rank=state.args.max_lora_rank,
                        roots=state.args.weights_roots,
                    )
                else:
                    load = partial(
                        load_checked_weights,
                        engine.model,
                        state.served_config,
                        req.model_path,
                        req.load_format,
                        roots=state.args.weights_roots,
                        commit=req.commit,
                    )
                tensors = await asyncio.to_thread(load)
            except WeightLoadError as e:
                logger.warning("weight update from %s refused: %s", req.model_path, e)
                return _reply(
                    {
                        "success": False,
                        "message": f"Failed to get weights iterator: {e}",
                        "num_paused_requests": 0,
                    },
                    status=400,
                )
            try:
                swap = await asyncio.wrap_future(
                    engine.update_weights(
                        tensors,
                        weight_version=req.weight_version,
                        abort_all_requests=req.abort_all_requests,
                        flush_cache=req.flush_cache,
                    )  # fmt: skip
                )
            except Exception as e:
                msg = f"Failed to update weights: {e}.\nRolling back to original weights."
                return _reply({"success": False, "message": msg, "num_paused_requests": 0}, status=400)
            state.model_path = req.model_path
            if not swap.flushed:  # SGLang 0.5.23: swapped, tagged, but a 400 and /model_info not updated
                logger.warning(
                    "weights from %s swapped, cache not flushed: requests still running", req.model_path
                )
                return _reply(
                    {"success": False, "message": NOT_FLUSHED_MESSAGE, "num_paused_requests": 0}, status=400
                )
            if req.weight_version is not None:
                state.reported_version = req.weight_version
            if not adapter:
                state.base_weights = None  # the base is gone from memory: no adapter can merge into it
            logger.info("weights from %s served in %.3fs", req.model_path, time.perf_counter() - t0)
        return _reply(
            {
                "success": True,
                "message": update_weights_message(req.weight_version),
                "num_paused_requests": swap.kept,
            }
        )

    async def update_weight_version(request: web.Request) -> web.Response:
        new, abort_all = parse_weight_version_update(await _json_body(request))
        if abort_all:
            await asyncio.wrap_future(engine.abort("", True))
        await asyncio.wrap_future(engine.set_weight_version(new))
        state.reported_version = new
        return _reply({"success": True, "message": f"Weight version updated to {new}", "new_version": new})

    async def flush_cache(request: web.Request) -> web.Response:
        if await asyncio.wrap_future(engine.flush_cache()):
            return web.Response(text=FLUSH_OK_TEXT, status=200)
        return web.Response(text="Cache not flushed because there are pending requests.\n", status=400)

    async def health(request: web.Request) -> web.Response:
        ok = engine.is_alive() and not state.shutting_down
        return web.Response(status=200 if ok else 503)

    async def health_generate(request: web.Request) -> web.Response:
        if not engine.is_alive() or state.shutting_down:
            return web.Response(status=503)
        st = engine.stats()
        if st["paused"] or st["num_running_reqs"] or st["num_waiting_reqs"]:
            return web.Response(status=200)  # busy or paused: the engine thread is alive, that is the answer
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        sp = WireSamplingParams(max_new_tokens=1, temperature=1.0, top_k=1, is_greedy=True)
        engine.submit(
            Sequence(
                rid=f"HEALTH_CHECK_{time.time_ns()}", prompt=[0], sp=sp, on_done=partial(_resolve, loop, fut)
            )
        )
        try:
            await asyncio.wait_for(fut, timeout=20.0)
        except TimeoutError:
            return web.Response(status=503)
        return web.Response(status=200)

    async def get_model_info(request: web.Request) -> web.Response:
        cfg = state.served_config
        return _reply(
            {
                "model_path": state.model_path,
                "served_model_name": state.args.served_model_name or state.model_path,
                "tokenizer_path": state.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": state.reported_version,
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": cfg.get("model_type"),
                "architectures": cfg.get("architectures"),
            }
        )

    async def get_server_info(request: web.Request) -> web.Response:
        a = state.args
        return _reply(
            {
                "model_path": state.model_path,
                "tokenizer_path": a.model_path,
                "host": a.host,
                "port": a.port,
                "load_format": "auto",
                "weight_version": state.reported_version,
                "api_key": "<redacted>" if a.api_key else None,
                "dtype": a.dtype,
                "max_running_requests": a.max_batch_size,
                "max_prefill_tokens": a.max_prefill_tokens,
                "threads": a.threads,
                "context_length": state.context_len,
                "launch_command": f"python -m infra.cpu_server --model-path {a.model_path} --port {a.port}",
                "status": "ready",
                "max_total_num_tokens": a.max_batch_size * state.context_len,
                "max_req_input_len": state.context_len - 1,
                "startup_time": state.started_at,
                "internal_states": [engine.stats()],
                "version": PROTOCOL_VERSION,
                "frontend": "rollflow-cpu",
            }
        )

    app = web.Application(middlewares=[guard], client_max_size=64 * 1024**2)
    for path, fn in (
        ("/generate", generate),
        ("/pause_generation", pause_generation),
        ("/continue_generation", continue_generation),
        ("/abort_request", abort_request),
        ("/update_weights_from_disk", update_weights_from_disk),
        ("/update_weight_version", update_weight_version),
    ):
        app.router.add_post(path, fn)
    app.router.add_put("/generate", generate)
    app.router.add_route("*", "/flush_cache", flush_cache)
    for path, fn in (
        ("/health", health),
        ("/health_generate", health_generate),
        ("/get_model_info", get_model_info),
        ("/model_info", get_model_info),
        ("/get_server_info", get_server_info),
        ("/server_info", get_server_info),
    ):
        app.router.add_get(path, fn)
    return app


async def serve(args: ServerArgs) -> None:
    """Load, serve until SIGTERM/SIGINT, then abort in-flight requests (partial outputs) and exit."""
    torch.set_num_threads(max(1, args.threads))
    state = await asyncio.to_thread(ServerState, args)
    state.engine.start()
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None, logger=http_logger)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as e:
        state.engine.shutdown()
        await runner.cleanup()
        raise SystemExit(f"cannot bind {args.host}:{args.port}: {e}") from e
    logger.info(
        "rollflow CPU server (SGLang %s protocol) on http://%s:%d", PROTOCOL_VERSION, args.host, args.port
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("shutting down")
    state.shutting_down = True
    state.unpaused.set()  # release waiting /generate calls; they answer 503
    await asyncio.to_thread(state.engine.shutdown)
    await asyncio.sleep(0.05)  # let the aborted replies go out
    await runner.cleanup()
