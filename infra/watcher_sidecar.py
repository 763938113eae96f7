"""The checkpoint watcher as a sidecar process beside SGLang or vLLM servers it did not launch.

What it is: a command line around ``rollflow.inference.watcher.CheckpointWatcher``. It waits for the
servers' ``/health``, opens the trial's storage and keeps the servers on the newest committed checkpoint
until SIGTERM or SIGINT. Its defaults are the config's (``InferenceConfig.poll_interval_s``,
``local_poll_interval_s``, ``weight_update_timeout_s``; ``StorageConfig.ack_ttl_s``), so a sidecar and
an embedded watcher behave alike unless told otherwise. Run it::

    python -m infra.watcher_sidecar --storage-root s3://bucket/runs --experiment E --trial T \\
        --servers 127.0.0.1:30000[,host:port...] [--cache-dir /ckpt-cache] [--poll-interval-s 1] \\
        [--local-poll-interval-s 0.02] [--no-in-place] [--ack-ttl-s 300] [--engine sglang|vllm|local]
    # API key from $ROLLFLOW_INFERENCE_API_KEY; S3 credentials from the AWS_* variables

What it is not: the watcher itself (its poll, verification and load order are in
``rollflow/inference/watcher.py``) or a server launcher (``infra/sglang_launcher.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

from rollflow.api.config import INFERENCE_API_KEY_ENV, InferenceConfig, StorageConfig
from rollflow.api.errors import InferenceError
from rollflow.inference.engines import ENGINE_NAMES, engine_for
from rollflow.inference.routing import control_call
from rollflow.inference.watcher import CheckpointWatcher
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "/tmp/rollflow-ckpt-cache"  # a sidecar container's scratch space (no project dir)
DEFAULT_ENGINE = "sglang"  # servers someone else runs speak SGLang's protocol (inference.engine auto)
WAIT_SERVERS_S = 1800.0  # SGLang takes minutes to load a large model


def build_parser() -> argparse.ArgumentParser:
    inf, st = InferenceConfig(), StorageConfig()
    p = argparse.ArgumentParser(prog="python -m infra.watcher_sidecar", description=__doc__.split("\n\n")[0])
    p.add_argument("--storage-root", required=True, help="Local path, file://... or s3://bucket/prefix.")
    p.add_argument("--experiment", required=True)
    p.add_argument("--trial", required=True)
    p.add_argument(
        "--servers", required=True, help="Comma-separated host:port of the servers to keep updated."
    )
    p.add_argument(
        "--server-ids", default=None, help="Comma-separated ack ids (default: derived from addresses)."
    )
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="Local cache the servers can read.")

    def seconds(flag: str, default: float, text: str) -> None:
        p.add_argument(flag, type=float, default=default, help=text)

    seconds("--poll-interval-s", inf.poll_interval_s, "Full polls of LATEST (S3 requests).")
    seconds(
        "--local-poll-interval-s",
        inf.local_poll_interval_s,
        "Local root: stat LATEST this often between full polls (0 = off).",
    )
    p.add_argument(
        "--no-in-place",
        action="store_true",
        help="Local root: copy into --cache-dir instead of loading from the store (servers can't see it).",
    )
    seconds("--request-timeout-s", inf.weight_update_timeout_s, "Timeout of one weight update.")
    seconds(
        "--ack-ttl-s",
        st.ack_ttl_s or 0.0,
        "The trial's storage.ack_ttl_s: acks are refreshed every ack_ttl_s / 4 (0 = never refresh).",
    )
    p.add_argument(
        "--storage-options", default="{}", help="JSON fsspec options, e.g. '{\"endpoint_url\": ...}'."
    )
    p.add_argument(
        "--wait-servers-s", type=float, default=WAIT_SERVERS_S, help="Wait this long for /health at start."
    )
    p.add_argument(
        "--engine", default=DEFAULT_ENGINE, choices=list(ENGINE_NAMES), help="The servers' engine."
    )
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s watcher: %(message)s")
    servers = [a.strip() for a in ns.servers.split(",") if a.strip()]
    ids = [s.strip() for s in ns.server_ids.split(",")] if ns.server_ids else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    wait_healthy(servers, ns.wait_servers_s, stop)
    storage = Storage.open(ns.storage_root, ns.experiment, ns.trial, json.loads(ns.storage_options))
    watcher = CheckpointWatcher(
        CheckpointStore(storage),
        servers,
        cache_dir=ns.cache_dir,
        poll_interval_s=ns.poll_interval_s,
        local_poll_interval_s=ns.local_poll_interval_s,
        in_place=not ns.no_in_place,
        api_key=os.environ.get(INFERENCE_API_KEY_ENV) or None,
        engine=engine_for(ns.engine),
        server_ids=ids,
        request_timeout_s=ns.request_timeout_s,
        ack_ttl_s=ns.ack_ttl_s or None,
        update_log_level=logging.INFO,  # a sidecar's log is its weight loads
    )
    logger.info("watching %s for %s", storage, ", ".join(servers))
    watcher.run(stop)
    logger.info("stopped; served version %s, %d error(s)", watcher.serving_version, len(watcher.errors))
    return 0


def wait_healthy(servers: list[str], timeout_s: float, stop: threading.Event) -> None:
    """Block until every server answers /health (SGLang takes minutes to load a large model)."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending and not stop.is_set():
        for a in list(pending):
            try:
                control_call(a, "/health", timeout_s=5.0)
                pending.remove(a)
            except InferenceError:
                pass
        if pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"servers not healthy after {timeout_s:.0f}s: {pending}")
            stop.wait(2.0)


if __name__ == "__main__":
    sys.exit(main())
