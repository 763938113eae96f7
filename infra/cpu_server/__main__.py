"""CLI of the CPU server: ``python -m infra.cpu_server --model-path DIR --port N [options]``.

What it is: argument parsing, logging setup and ``asyncio.run(serve(...))``. The API key is read from
``--api-key`` or, preferably (it then stays out of ``ps``), from the ``ROLLFLOW_INFERENCE_API_KEY``
environment variable. A non-loopback ``--host`` without an API key is refused (exit 2) unless
``--allow-unauthenticated`` is given. ``--weights-root DIR`` (repeatable, or ``ROLLFLOW_WEIGHTS_ROOTS``
separated by ``os.pathsep``) limits ``/update_weights_from_disk`` to those directories; without one a
server that is not on loopback warns that it loads any directory it can read. Exits 0 after a clean SIGTERM/SIGINT shutdown
(with ``os._exit`` once every reply is out, skipping torch's slow interpreter teardown).

What it is not: the server itself (``infra.cpu_server.app``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from rollflow.api.config import INFERENCE_API_KEY_ENV as API_KEY_ENV
from rollflow.api.config import INFERENCE_WEIGHTS_ROOTS_ENV as WEIGHTS_ROOTS_ENV
from rollflow.api.net import is_loopback_host


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m infra.cpu_server", description=__doc__)
    p.add_argument("--model-path", required=True, help="Hugging Face model directory (config + safetensors).")
    p.add_argument(
        "--host", default="127.0.0.1", help="Bind address (default loopback; set an API key otherwise)."
    )
    p.add_argument("--port", type=int, default=30000, help="TCP port (SGLang's default 30000).")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"Bearer key required on every route but /health* (or ${API_KEY_ENV}).",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="Serve on a non-loopback --host without an API key (refused otherwise).",
    )
    p.add_argument(
        "--weights-root",
        action="append",
        default=None,
        help=f"A directory /update_weights_from_disk may load from (repeatable; or ${WEIGHTS_ROOTS_ENV}).",
    )
    p.add_argument("--max-batch-size", type=int, default=64, help="Max sequences decoded together.")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (torch.set_num_threads).")
    p.add_argument(
        "--weight-version", default="default", help="Initial weight_version string (SGLang: 'default')."
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="Parameter dtype.")
    p.add_argument("--context-length", type=int, default=None, help="Override max_position_embeddings.")
    p.add_argument(
        "--max-prefill-tokens", type=int, default=8192, help="Padded prompt tokens admitted per step."
    )
    p.add_argument(
        "--seed", type=int, default=None, help="Seed of the draws of requests without sampling_seed."
    )
    p.add_argument(
        "--batch-window-ms", type=float, default=3.0, help="An idle server waits this long to batch a burst."
    )
    p.add_argument("--served-model-name", default=None, help="Name reported by /get_model_info.")
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        help="Refuse LoRA adapters above this rank (SGLang's flag).",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format="%(asctime)s %(levelname)s [cpu_server:%(process)d] %(name)s: %(message)s",
    )
    if ns.max_batch_size < 1 or ns.threads < 1:
        print("--max-batch-size and --threads must be >= 1", file=sys.stderr)
        return 2
    api_key = ns.api_key or os.environ.get(API_KEY_ENV) or None
    if not api_key and not is_loopback_host(ns.host) and not ns.allow_unauthenticated:
        print(
            f"refusing to serve on {ns.host} without an API key: anybody who reaches the port could "
            f"generate and load weights. Set ${API_KEY_ENV} (or --api-key), bind 127.0.0.1, or pass "
            "--allow-unauthenticated",
            file=sys.stderr,
        )
        return 2
    roots = tuple(
        ns.weights_root or [r for r in os.environ.get(WEIGHTS_ROOTS_ENV, "").split(os.pathsep) if r]
    )
    if not roots and not is_loopback_host(ns.host):
        logging.getLogger("infra.cpu_server").warning(
            "serving on %s with no --weights-root: /update_weights_from_disk loads any directory this "
            "process can read",
            ns.host,
        )
    from infra.cpu_server.app import ServerArgs, serve

    args = ServerArgs(
        model_path=ns.model_path,
        host=ns.host,
        port=ns.port,
        api_key=api_key,
        weights_roots=roots,
        max_lora_rank=ns.max_lora_rank,
        max_batch_size=ns.max_batch_size,
        threads=ns.threads,
        weight_version=ns.weight_version,
        dtype=ns.dtype,
        context_length=ns.context_length,
        max_prefill_tokens=ns.max_prefill_tokens,
        seed=ns.seed,
        served_model_name=ns.served_model_name,
        batch_window_ms=ns.batch_window_ms,
    )
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    code = main()
    # Every request has been answered and the socket closed; skip the interpreter's slow teardown of
    # torch / transformers modules (2-3 s on a busy 2-core machine) so SIGTERM -> exit stays fast.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
