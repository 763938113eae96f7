"""The engine contract: what rollflow asks of one inference engine's HTTP server, whichever engine it is.

What it is: the ``Engine`` Protocol that ``EngineClient`` (generation), ``CheckpointWatcher`` /
``FleetHealth`` (weights, health) and the launchers in ``infra/`` (start, stop) go through, and the
value types it speaks in. One implementation per engine (``rollflow.inference.engines.engine_for``):

- ``local`` (``rollflow.inference.sglang.LocalEngine``): rollflow's CPU server (``infra/cpu_server``),
  which speaks SGLang's native protocol;
- ``sglang`` (``rollflow.inference.sglang.SGLangEngine``): SGLang on GPUs, the same protocol;
- ``vllm`` (``rollflow.inference.vllm.VLLMEngine``): vLLM's token-in/token-out route and its dev-mode RL
  routes; the CPU build here and the CUDA build on GPUs take the same client.

Every engine returns, per generated token, its logprob and the weight version that produced it; a
request interrupted by a pause comes back with ``finish_type == "abort"`` and its partial output, and
the client re-submits prompt + output so far (docs/inference.md, "Interrupted requests"). A weight
update is ``pause(mode)`` -> ``load_weights(dir, version)`` -> ``resume()``; ``load_weights`` either
serves the new weights and reports ``version``, or raises ``WeightUpdateError`` with the old weights
still serving.

What it is not: no HTTP session (the client owns its aiohttp session; blocking calls go through
``rollflow.inference.routing.control_call``), no retry or routing policy, no process spawning
(``infra/servers.py`` runs the argv ``launch_command`` returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rollflow.api.config import InferenceConfig
from rollflow.api.inference import SamplingParams
from rollflow.inference.sglang_protocol import GenerateOutput

EngineName = Literal["local", "vllm", "sglang"]
ENGINE_NAMES: tuple[str, ...] = ("local", "vllm", "sglang")


@dataclass(frozen=True)
class HttpCall:
    """One HTTP request an engine wants sent: ``POST route`` with ``payload`` as JSON."""

    route: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class LaunchArgs:
    """Which server to start: number ``index`` of ``cfg.n_servers``, on ``cfg.host:port``, serving
    ``model_path`` labelled ``weight_version`` (``cfg.initial_weight_version`` when None)."""

    model_path: str | Path
    port: int
    cfg: InferenceConfig
    index: int = 0
    weight_version: str | None = None

    @property
    def version(self) -> str:
        return self.weight_version if self.weight_version is not None else self.cfg.initial_weight_version


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one server: the argv and the environment it adds (secrets included: never logged)."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """One engine's wire protocol and launch line. Implementations are stateless apart from caches."""

    name: EngineName
    pause_modes: tuple[str, ...]  # the ``inference.update_pause_mode`` values it can honour
    batches: bool  # one generate call can carry a group's prompts (``generate_call`` with n > 1)
    # ... but only when they are one prompt sampled n times (vLLM's ``n``), not n different prompts
    batches_one_prompt_only: bool
    # the server checks each weight file's digest against COMMIT.json's as it reads it (``load_weights``'s
    # ``commit``), so the watcher need not hash the weights first: one read instead of two
    verifies_on_load: bool

    def generate_call(
        self, tags: list[str], inputs: list[list[int]], sampling: SamplingParams, max_new_tokens: int
    ) -> HttpCall:
        """The request for ``inputs[i]`` under request id ``tags[i]`` (n > 1 only if ``batches``)."""
        ...

    def parse_generate(self, body: Any, n: int) -> list[GenerateOutput]:
        """``n`` replies from a 200 body; raises ``InvalidRequestError`` (or KeyError/TypeError/ValueError)
        when it is not one."""
        ...

    def abort_call(self, tags: list[str]) -> HttpCall:
        """Abort the requests sent under ``tags`` (their partial output comes back as an abort)."""
        ...

    def pause(self, address: str, mode: str, *, api_key: str | None, timeout_s: float) -> None: ...

    def resume(self, address: str, *, api_key: str | None, timeout_s: float) -> None: ...

    def load_weights(
        self,
        address: str,
        path: str | Path,
        version: str,
        *,
        api_key: str | None,
        timeout_s: float,
        commit: Mapping[str, Any] | None = None,
    ) -> None:
        """Load the checkpoint directory ``path`` and report ``version`` (between pause and resume).

        ``commit`` (``{"hash": algo, "files": {name: {"size", algo}}}``, from COMMIT.json; only for an engine
        that ``verifies_on_load``): the server refuses any weight file whose bytes differ from it.

        Raises ``WeightUpdateError`` (old weights still served) or ``ServerUnavailableError``.
        """
        ...

    def served_version(self, address: str, *, api_key: str | None, timeout_s: float) -> str | None:
        """The weight version the server reports (``None`` if it reports none); raises
        ``ServerUnavailableError`` / ``InferenceError`` when it does not answer."""
        ...

    def health(self, address: str, *, timeout_s: float = 2.0) -> bool: ...

    def launch(self, args: LaunchArgs) -> LaunchSpec:
        """How to start server ``args.index`` of ``args.cfg`` on ``cfg.host:args.port``."""
        ...
