"""Blocking control calls to a set of servers: pause / continue generation, served weight versions.

What it is: a tiny synchronous facade over an ``Engine``'s control methods (``rollflow.inference``) for
orchestration code that is not on an event loop (trainer hooks of the synchronous baseline, readiness
checks). The engine defaults to SGLang's protocol (the CPU server and SGLang); pass
``engine_for(cfg.inference)`` for vLLM.
``PauseServersHooks`` are the trainer hooks of the synchronous baseline
(``rollout.pause_during_training``): generation pauses while each optimizer step runs.
What it is not: the generation client (``rollflow.inference.client``), which retries and resumes.
"""

from __future__ import annotations

from rollflow.inference.contract import Engine
from rollflow.inference.sglang import SGLangEngine


class ServerControl:
    def __init__(
        self,
        addresses: list[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        engine: Engine | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._engine: Engine = engine if engine is not None else SGLangEngine()

    def pause(self, mode: str = "abort") -> None:
        for a in self.addresses:
            self._engine.pause(a, mode, api_key=self._api_key, timeout_s=self._timeout_s)

    def resume(self) -> None:
        for a in self.addresses:
            self._engine.resume(a, api_key=self._api_key, timeout_s=self._timeout_s)

    def weight_versions(self) -> dict[str, str]:
        """Server address -> the weight_version it serves."""
        return {
            a: str(self._engine.served_version(a, api_key=self._api_key, timeout_s=self._timeout_s))
            for a in self.addresses
        }


class PauseServersHooks:
    """TrainerHooks that pause generation during each optimizer step (the synchronous baseline)."""

    def __init__(self, addresses: list[str], api_key: str | None, engine: Engine | None = None) -> None:
        self._control = ServerControl(addresses, api_key=api_key, engine=engine)

    def before_step(self, version: int) -> None:
        self._control.pause()

    def after_step(self, version: int) -> None:
        self._control.resume()
