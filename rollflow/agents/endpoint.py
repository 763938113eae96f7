"""AgentEndpoint: an OpenAI-compatible HTTP endpoint per agent episode, inside the rollout process.

What it is. One aiohttp server on the rollout's event loop (127.0.0.1, a free port by default). Each
episode gets its own ``base_url`` and api key::

    handle = endpoint.open_episode(client, limits)
    handle.base_url   # http://127.0.0.1:PORT/episodes/<episode_id>/v1
    handle.api_key    # a random secret of this episode

Routes under ``{base_url}``: ``POST /chat/completions`` (with ``tools`` / ``tool_calls``),
``POST /completions``, ``GET /models``. The same routes under ``/v1`` find the episode by its key
alone. A call is authenticated with ``Authorization: Bearer <api_key>``; no key, an unknown key, or
the key of another episode than the URL names (open or ended) gets 401 ``invalid_api_key`` and is
counted (``calls_refused_unknown_key``, ``calls_refused_foreign_key``); the key of an episode that has
ended, on its own URL or on ``/v1``, gets 410 ``episode_closed`` (``calls_after_close``; the newest
``max_closed_keys`` ended keys are remembered, older ones are unknown: 401).

Each call is forwarded to the inference engine through the episode's ``InferenceClient`` (the same
``agenerate`` every workflow uses, so it runs on SGLang and on the CPU server alike, resumes across
weight updates and fails over) and recorded in the episode's ``EpisodeRecorder``: prompt ids as sent,
completion ids, behaviour logprobs, per-token versions.

Prompts: chat calls are built by ``ChatPrompter`` (exact previous context + the template's delta),
``/completions`` text prompts likewise extend the previous context when they start with the previous
prompt text + the returned text (only the new suffix is tokenized); a token-id prompt is sent as is.

Sampling follows the workflow's ``SamplingParams`` (temperature, top-p/k, min-p), whatever the agent
asks: the trainer's importance weights and recomputed logprobs assume that distribution. The agent's
``max_tokens`` (default: the workflow's ``max_new_tokens``) is capped by the episode's token budget;
its ``seed`` is honoured; the template's end-of-turn token is a stop token of chat calls.

Tokenizing and rendering the chat template run off the event loop, on a small pool of tokenizer
threads (``TOKENIZE_THREADS``; a fast tokenizer encodes concurrently as long as nobody changes its
truncation or padding, and the endpoint never does), so a long message delays only its own call, never
the other episodes served on the same loop. A body past the episode's byte limit gets 413
``request_too_large`` as soon as its length is known, before anything is parsed or tokenized
(``rollflow.agents.request_body``); a call that asks ``Expect: 100-continue`` gets the 413 (or its
401/410) instead of ``100 Continue``. Which episode a key opens: ``rollflow.agents.episode_keys``.

Errors, in OpenAI's envelope: 400 for a request the endpoint cannot serve (``AgentRequestError``) or one
that breaks an episode limit (``EpisodeLimitError``: ``max_turns_exceeded``, ``token_budget_exceeded``,
``episode_stale``; the episode is dropped), 401/410 as above, 413 for a body over the limit, 503 when the
engine failed. An error the endpoint did not foresee is a 500 ``internal_error`` envelope, never a
traceback page. Refusals are logged at most once per client per minute (``RefusalLog``).

What it is not: not a general OpenAI server (one choice, no embeddings, no server-side tools), and no
episode logic beyond recording (``rollflow.workflows.agent``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler  # the "100 Continue" a call asked for

from rollflow.agents.chat_prompt import ChatPrompter
from rollflow.agents.counts import AgentCounts
from rollflow.agents.episode_keys import EndpointHTTPError, EpisodeKeys, episode_over
from rollflow.agents.openai_protocol import (
    ChatRequest,
    CommonParams,
    CompletionRequest,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    error_body,
    parse_chat_request,
    parse_completion_request,
    sse,
)
from rollflow.agents.recorder import CallRecord, EpisodeLimits, EpisodeRecorder
from rollflow.agents.request_body import body_limit, read_json, too_large
from rollflow.agents.tool_calls import ParsedReply, ToolFormat, parse_tool_calls
from rollflow.api.errors import AgentRequestError, EpisodeLimitError, InferenceError, InvalidRequestError
from rollflow.api.inference import GenerateRequest, GenerateResult, InferenceClient, SamplingParams
from rollflow.api.tokenizer import ChatTokenizer
from rollflow.inference.refusal_log import OncePerClientFilter, RefusalLog

logger = logging.getLogger(__name__)
T = TypeVar("T")
# aiohttp's own log of malformed HTTP (a traceback per request): at most once per client per minute
http_logger = logging.getLogger(f"{__name__}.http")
http_logger.addFilter(OncePerClientFilter())

TOKENIZE_THREADS = 4  # calls tokenized at once, off the event loop

_LIMIT_CODES = {
    "max_turns": "max_turns_exceeded",
    "token_budget": "token_budget_exceeded",
    "stale": "episode_stale",
}


@dataclass
class EpisodeHandle:
    """One open episode: where its agent calls, with which key, and what was recorded."""

    episode_id: str
    api_key: str
    base_url: str
    client: InferenceClient
    recorder: EpisodeRecorder
    closed: bool = False
    in_flight: set[asyncio.Task[GenerateResult]] = field(default_factory=set)
    n_calls: int = 0


class AgentEndpoint:
    """The per-episode OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        sampling: SamplingParams | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "rollflow-policy",
        counts: AgentCounts | None = None,
        max_closed_keys: int = 65536,
        tool_format: ToolFormat = "hermes",
        max_body_bytes_per_token: int = 64,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompter = ChatPrompter(tokenizer, tool_format=tool_format)
        self.sampling = sampling or SamplingParams()
        self.host, self.port = host, port
        self.model_name = model_name
        self.counts = counts or AgentCounts()
        self._keys: EpisodeKeys[EpisodeHandle] = EpisodeKeys(max_closed_keys)
        self._by_key = self._keys.open  # the open episodes by key
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None
        self._bound_port: int | None = None
        self.max_body_bytes_per_token = max_body_bytes_per_token
        self._refusals = RefusalLog(logger)
        self._tokenize_pool: ThreadPoolExecutor | None = None

    # --- lifecycle -------------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the endpoint serves on (None before ``astart``)."""
        return self._loop

    @property
    def url(self) -> str:
        if self._bound_port is None:
            raise RuntimeError("the agent endpoint is not started (await astart())")
        return f"http://{self.host}:{self._bound_port}"

    async def astart(self) -> None:
        """Start serving on the running loop (idempotent; restarts if called from a new loop)."""
        loop = asyncio.get_running_loop()
        if self._runner is not None and self._loop is loop:
            return
        if self._loop is not loop:
            self._runner, self._loop, self._bound_port = None, loop, None
            self._start_lock = asyncio.Lock()
            self._by_key.clear()
        assert self._start_lock is not None
        async with self._start_lock:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=64 * 1024 * 1024)
            chat, completion = (functools.partial(self._serve, kind=k) for k in ("chat", "completion"))
            for prefix in ("/episodes/{episode}/v1", "/v1"):
                app.router.add_post(prefix + "/chat/completions", chat, expect_handler=self._expect)
                app.router.add_post(prefix + "/completions", completion, expect_handler=self._expect)
                app.router.add_get(prefix + "/models", self._models)
            runner = web.AppRunner(app, access_log=None, logger=http_logger)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, backlog=1024)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []  # the bound port when port=0
            self._bound_port = int(sockets[0].getsockname()[1]) if sockets else self.port
            self._runner = runner
            logger.info("agent endpoint serving on %s", self.url)

    async def aclose(self) -> None:
        for handle in list(self._by_key.values()):
            self.close_episode(handle, reason="endpoint closed")
        if self._runner is not None and self._loop is asyncio.get_running_loop():
            await self._runner.cleanup()
        self._runner, self._bound_port = None, None
        if self._tokenize_pool is not None:
            self._tokenize_pool.shutdown(wait=False)
            self._tokenize_pool = None

    async def _off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a tokenizer thread: tokenizing a long message never blocks the
        loop that serves every other episode."""
        if self._tokenize_pool is None:
            self._tokenize_pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="agent-tokenize")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, functools.partial(fn, *args, **kwargs))

    def body_limit(self, handle: EpisodeHandle) -> int:
        """The largest request body (bytes) this episode's calls may send (module docstring)."""
        return body_limit(self.max_body_bytes_per_token, handle.recorder.limits.max_episode_tokens)

    # --- episodes --------------------------------------------------------------------------------------

    def open_episode(self, client: InferenceClient, limits: EpisodeLimits | None = None) -> EpisodeHandle:
        """Register a new episode; its agent calls ``handle.base_url`` with ``handle.api_key``."""
        episode_id = uuid.uuid4().hex
        key = "rf-" + secrets.token_urlsafe(24)
        handle = EpisodeHandle(
            episode_id=episode_id,
            api_key=key,
            base_url=f"{self.url}/episodes/{episode_id}/v1",
            client=client,
            recorder=EpisodeRecorder(episode_id, limits or EpisodeLimits()),
        )
        self._keys.add(handle)
        return handle

    def close_episode(self, handle: EpisodeHandle, *, reason: str = "the episode ended") -> None:
        """Unregister the episode and cancel its calls still in flight (their rids are aborted)."""
        handle.closed = True
        self._keys.close(handle, reason)
        for task in list(handle.in_flight):
            task.cancel()

    # --- HTTP ------------------------------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> EpisodeHandle:
        """The open episode of the call's key; 401 for a key that is not this URL's episode's, 410 for
        the key of this episode once it has ended."""
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        wanted = request.match_info.get("episode")
        try:
            return self._keys.resolve(key, wanted)
        except EndpointHTTPError as e:
            if e.kind == "foreign":
                self.counts.calls_refused_foreign_key += 1
                owner = self._keys.owner(key)
                self._refusals.refused(
                    _client(request), f"episode {owner}'s key used on episode {wanted} (401)"
                )
            elif e.kind == "closed":
                self.counts.calls_after_close += 1
            else:
                self.counts.calls_refused_unknown_key += 1
                self._refusals.refused(
                    _client(request), f"a call with an unknown api key on {request.path} (401)"
                )
            raise

    def _error_response(self, request: web.Request, e: EndpointHTTPError) -> web.Response:
        if e.status in (400, 413):
            self._refusals.refused(_client(request), f"{e.status} {e.code}: {e}")
        return web.json_response(
            error_body(str(e), type_=e.type_, param=e.param, code=e.code), status=e.status
        )

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse a bad key or a declared length past the limit now, before the
        agent sends the body; otherwise invite it (``100 Continue``)."""
        try:
            limit = self.body_limit(self._authenticate(request))
            if request.content_length is not None and request.content_length > limit:
                raise too_large(limit, self.max_body_bytes_per_token)
        except EndpointHTTPError as e:
            return self._error_response(request, e)
        await _default_expect_handler(request)
        return None

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            handle = self._authenticate(request)
            limit = self.body_limit(handle)
            refusal = too_large(limit, self.max_body_bytes_per_token)
            body = await read_json(request, limit, refusal, self._off_loop)
            if kind == "chat":
                reply, stream = await self._achat(handle, parse_chat_request(body))
            else:
                reply, stream = await self._acompletion(handle, parse_completion_request(body))
        except EndpointHTTPError as e:
            return self._error_response(request, e)
        except AgentRequestError as e:
            self.counts.calls_invalid += 1
            self._refusals.refused(_client(request), f"400 {e.code or 'invalid_request'}: {e}")
            return web.json_response(error_body(str(e), param=e.param, code=e.code), status=400)
        except ConnectionResetError:
            # the agent went away before its request was read: at the end of a run, or an agent that was
            # cancelled or timed out. Nobody is there to answer; no traceback.
            logger.debug("agent endpoint: the client closed the connection before its request was read")
            return web.Response(status=499)
        except web.HTTPException:
            raise
        except Exception as e:  # a case nobody foresaw: an envelope, never aiohttp's traceback page
            self._refusals.refused(_client(request), f"500 {type(e).__name__}: {e}", exc_info=e)
            return web.json_response(
                error_body(
                    f"internal error: {type(e).__name__}", type_="server_error", code="internal_error"
                ),
                status=500,
            )
        if not stream:
            return web.json_response(reply)
        events = chat_chunks(reply) if kind == "chat" else completion_chunks(reply)
        return web.Response(body=sse(events), content_type="text/event-stream")

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._authenticate(request)
        except EndpointHTTPError as e:
            return self._error_response(request, e)
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rollflow"}
        return web.json_response({"object": "list", "data": [model]})

    # --- calls -----------------------------------------------------------------------------------------

    async def _achat(self, handle: EpisodeHandle, req: ChatRequest) -> tuple[dict[str, Any], bool]:
        rec = handle.recorder
        last = rec.calls[-1] if rec.calls else None
        ids: list[int] | None = None
        if last is not None and last.kind == "chat" and last.messages is not None and last.reply is not None:
            delta = await self._off_loop(
                self.prompter.delta_ids, last.messages, last.tools, last.reply, req.messages, req.tools,
                last_token=last.output_ids[-1] if last.output_ids else None,
            )  # fmt: skip
            if delta is not None:
                ids = last.context + delta
        if ids is None:
            ids = await self._off_loop(self.prompter.full_ids, req.messages, req.tools)
        eot = self.prompter.end_of_turn_id  # ignore_eos: the agent wants no stop at the turn's end either
        stops = [eot] if eot is not None and not req.ignore_eos else []
        call, res = await self._agenerate(handle, req, ids, "chat", extra_stops=stops)
        text = await self._off_loop(self.tokenizer.decode, res.output_ids, skip_special_tokens=True)
        parsed = (
            parse_tool_calls(text, turn=call.index, fmt=self.prompter.tool_format)
            if req.tools and req.tool_choice == "auto"
            else ParsedReply(text)
        )
        self.counts.tool_calls += len(parsed.tool_calls)
        self.counts.tool_call_parse_errors += parsed.parse_errors
        message = parsed.message()
        call.text, call.messages, call.tools, call.reply = text, req.messages, req.tools, message
        self._record(handle, call)
        finish = (
            "tool_calls" if parsed.tool_calls else ("length" if res.finish_reason == "length" else "stop")
        )
        reply = chat_response(
            call_id=f"chatcmpl-{handle.episode_id}-{call.index}",
            model=req.model or self.model_name,
            message=message,
            finish_reason=finish,
            n_prompt=len(ids),
            n_completion=len(res.output_ids),
            fingerprint=self._fingerprint(res),
            logprobs=await self._logprobs(res) if req.logprobs else None,
        )
        return reply, req.stream

    async def _acompletion(
        self, handle: EpisodeHandle, req: CompletionRequest
    ) -> tuple[dict[str, Any], bool]:
        rec = handle.recorder
        if isinstance(req.prompt, list):
            ids = list(req.prompt)
        else:
            last = rec.calls[-1] if rec.calls else None
            ids = None
            if last is not None and last.kind == "completion" and last.prompt_text is not None:
                before = last.prompt_text + last.text
                if req.prompt.startswith(before) and len(req.prompt) > len(before):
                    suffix = req.prompt[len(before) :]
                    ids = last.context + await self._off_loop(self._encode_text, suffix, first=False)
            if ids is None:
                ids = await self._off_loop(self._encode_text, req.prompt, first=True)
        call, res = await self._agenerate(handle, req, ids, "completion", extra_stops=[])
        call.text = await self._off_loop(self.tokenizer.decode, res.output_ids, skip_special_tokens=True)
        call.prompt_text = req.prompt if isinstance(req.prompt, str) else None
        self._record(handle, call)
        reply = completion_response(
            call_id=f"cmpl-{handle.episode_id}-{call.index}",
            model=req.model or self.model_name,
            text=call.text,
            finish_reason="length" if res.finish_reason == "length" else "stop",
            n_prompt=len(ids),
            n_completion=len(res.output_ids),
            fingerprint=self._fingerprint(res),
            logprobs=await self._logprobs(res) if req.logprobs else None,
        )
        return reply, req.stream

    def _encode_text(self, text: str, *, first: bool) -> list[int]:
        if not text:
            raise AgentRequestError("'prompt' must not be empty", param="prompt")
        return list(self.tokenizer.encode(text, add_special_tokens=first))

    async def _agenerate(
        self, handle: EpisodeHandle, req: CommonParams, ids: list[int], kind: str, *, extra_stops: list[int]
    ) -> tuple[CallRecord, GenerateResult]:
        """Admit, send and wait for one call; raises ``EndpointHTTPError`` for every refusal."""
        rec = handle.recorder
        if handle.closed:
            self.counts.calls_after_close += 1
            raise episode_over()
        requested = req.max_tokens if req.max_tokens is not None else self.sampling.max_new_tokens
        try:
            max_new = rec.admit(ids, requested, version=int(handle.client.get_version()))
        except EpisodeLimitError as exc:
            logger.info("agent episode %s dropped: %s", handle.episode_id, exc)
            raise EndpointHTTPError(
                400, str(exc), type_="invalid_request_error", code=_LIMIT_CODES.get(exc.reason, exc.reason)
            ) from None
        stops = list(dict.fromkeys([*self.sampling.stop_token_ids, *req.stop_token_ids, *extra_stops]))
        sampling = replace(
            self.sampling,
            max_new_tokens=max_new,
            stop_token_ids=stops,
            ignore_eos=req.ignore_eos or self.sampling.ignore_eos,
            sampling_seed=req.seed if req.seed is not None else self.sampling.sampling_seed,
        )
        index = handle.n_calls
        handle.n_calls += 1
        # One rid per episode keeps its calls on one server (prefix cache); a parallel call gets its own.
        rid = handle.episode_id if not handle.in_flight else f"{handle.episode_id}-{index}"
        self.counts.calls += 1
        t0 = time.monotonic()
        task = asyncio.ensure_future(handle.client.agenerate(GenerateRequest(list(ids), sampling, rid=rid)))
        handle.in_flight.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            handle.in_flight.discard(task)
        if task.cancelled() or handle.closed:
            self.counts.calls_after_close += 1
            raise episode_over()
        exc = task.exception()
        if isinstance(exc, InvalidRequestError):
            self.counts.calls_invalid += 1
            raise EndpointHTTPError(
                400,
                f"the engine refused the call: {exc}",
                type_="invalid_request_error",
                code="engine_rejected",
            )
        if exc is not None:
            self.counts.calls_engine_error += 1
            logger.warning("agent episode %s: inference failed: %s", handle.episode_id, exc)
            kind_ = "inference error" if isinstance(exc, InferenceError) else type(exc).__name__
            raise EndpointHTTPError(503, f"{kind_}: {exc}", type_="server_error", code="engine_error")
        res = task.result()
        if res.finish_reason == "abort":  # the client gave up (shutting down): nothing to train on
            rec.drop("aborted", f"call {index} was aborted by the inference client")
            self.counts.calls_engine_error += 1
            raise EndpointHTTPError(
                503, "the inference client is shutting down", type_="server_error", code="engine_aborted"
            )
        call = CallRecord(
            index=index,
            kind=kind,  # type: ignore[arg-type]
            prompt_ids=list(ids),
            output_ids=list(res.output_ids),
            logprobs=list(res.output_logprobs),
            versions=list(res.output_versions),
            finish_reason=res.finish_reason,
            latency_s=time.monotonic() - t0,
        )
        return call, res

    def _record(self, handle: EpisodeHandle, call: CallRecord) -> None:
        rec = handle.recorder
        before = rec.calls[-1].segment if rec.calls else 0
        rec.record(call)
        if call.segment != before:
            self.counts.segments_new += 1

    def _fingerprint(self, res: GenerateResult) -> str:
        return f"rollflow-v{max(res.output_versions)}" if res.output_versions else "rollflow"

    async def _logprobs(self, res: GenerateResult) -> tuple[list[str], list[float]]:
        def decode_each() -> list[str]:
            return [self.tokenizer.decode([t], skip_special_tokens=False) for t in res.output_ids]

        return await self._off_loop(decode_each), list(res.output_logprobs)


def _client(request: web.Request) -> str:
    return request.remote or "unknown"
