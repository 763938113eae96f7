"""The server check: start one inference server the way a run starts it, generate with logprobs, stop.

Run it in the GPU image on a GPU machine, after building the image (a ``docker build`` has no GPU, so the
image's own build step can only import SGLang; this is the check that its server runs):

    docker run --rm --gpus all --ipc=host <registry>/rollflow:gpu python -m infra.server_check

and here, against SGLang's CPU server (``make sglang-venv``) or any other backend:

    python -m infra.server_check --config configs/tiny_cpu.yaml inference.backend=sglang

What it does: resolves the config with the dotted overrides (default: ``configs/tiny_cpu.yaml`` with
``inference.backend=sglang``; SGLang's device ``auto`` is the GPU where there is one), builds the config's
tiny model when ``model.bootstrap_tiny`` is set (no network), starts ONE server through the same launcher
the flow uses, sends a batch of 4 prompts x 8 new tokens with logprobs through rollflow's client, checks
that every token came back with a finite logprob and the initial weight version, and stops the server.
It prints ``key value`` lines (``server_start_s``, ``generate_s``, ``tokens``) and exits 0; a server that
does not start or answers wrong exits 1 with the reason (and the server's log tail).

What it is not: a benchmark (``bench.inference``) or a training run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

from infra.launch import launch_configured_servers
from rollflow.api.errors import ServerStartupError
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.configuration.loader import load_config
from rollflow.inference.client import EngineClient
from rollflow.inference.engines import engine_for

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"
DEFAULT_OVERRIDES = ("inference.backend=sglang",)
PROMPTS = [[2, 5, 6, 7], [2, 8, 9], [2, 10, 11, 12, 13], [2, 14]]
NEW_TOKENS = 8


class ServerCheckError(RuntimeError):
    """The server started but answered wrong (the message says what)."""


def check(config: str, overrides: list[str]) -> dict[str, float | str]:
    """Start, generate, stop; the figures. Raises ServerStartupError or ServerCheckError."""
    cfg = load_config(config, [*overrides, "inference.n_servers=1"])
    model_path = cfg.model.path
    if cfg.model.bootstrap_tiny:
        from rollflow.models.bootstrap import bootstrap_for

        model_path = str(bootstrap_for(cfg))
    t0 = time.perf_counter()
    group = launch_configured_servers(cfg, model_path)
    try:
        start_s = time.perf_counter() - t0
        client = EngineClient(
            group.addresses, engine=engine_for(cfg.inference), api_key=cfg.inference.api_key
        )
        sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, ignore_eos=True)

        async def generate() -> list[GenerateResult]:
            try:
                return await client.agenerate_many([GenerateRequest(p, sampling) for p in PROMPTS])
            finally:
                await client.aclose()

        t0 = time.perf_counter()
        results = asyncio.run(generate())
        generate_s = time.perf_counter() - t0
    finally:
        group.stop()
    version = int(cfg.inference.initial_weight_version)
    for prompt, res in zip(PROMPTS, results, strict=True):
        if len(res.output_ids) != NEW_TOKENS or len(res.output_logprobs) != NEW_TOKENS:
            raise ServerCheckError(f"prompt {prompt}: {len(res.output_ids)} tokens back, {NEW_TOKENS} asked")
        if not all(math.isfinite(x) and x <= 0 for x in res.output_logprobs):
            raise ServerCheckError(f"prompt {prompt}: logprobs not finite and <= 0: {res.output_logprobs}")
        if set(res.output_versions) != {version}:
            raise ServerCheckError(f"prompt {prompt}: versions {set(res.output_versions)}, served {version}")
    return {
        "backend": cfg.inference.backend,
        "server_start_s": start_s,
        "generate_s": generate_s,
        "tokens": float(NEW_TOKENS * len(PROMPTS)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help=f"experiment config (default {DEFAULT_CONFIG})")
    ap.add_argument(
        "overrides", nargs="*",
        help=f"dotted overrides (default, with the default config: {' '.join(DEFAULT_OVERRIDES)})",
    )  # fmt: skip
    args = ap.parse_args(argv)
    overrides = args.overrides or (list(DEFAULT_OVERRIDES) if args.config == DEFAULT_CONFIG else [])
    if not Path(args.config).is_file():
        print(
            f"server_check: error: no config file {args.config!r}; run from the repository root",
            file=sys.stderr,
        )
        return 2
    try:
        figures = check(args.config, overrides)
    except (ServerStartupError, ServerCheckError) as e:
        print(f"server_check: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for k, v in figures.items():
        print(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}", flush=True)
    print("server_check: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
