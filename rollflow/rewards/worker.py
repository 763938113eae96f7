"""The reward worker process: ``python -m rollflow.rewards.worker SPEC READ_FD WRITE_FD``.

What it is: the other end of ``rollflow.rewards.runner``. It imports the reward function named by
``SPEC`` (``"pkg.module:name"``), writes ``{"ready": true}`` (or ``{"error": ...}``) on ``WRITE_FD``,
then answers one request per line read from ``READ_FD``:

    request  {"id": int, "prompt": str, "completion": str, "answer": ..., "data": {...}}
    reply    {"id": int, "score": float} | {"id": int, "error": str}

one JSON object per line (JSON escapes newlines inside strings). It exits at EOF on ``READ_FD`` and
when its parent process goes away. The parent's ``sys.path`` arrives in ``ROLLFLOW_REWARD_SYS_PATH``
so functions importable in the parent (test helpers included) are importable here.

What it is not: something to start by hand; the runner starts, times and kills it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from rollflow.rewards.protocol import RewardValueError, check_reward, import_string

SYS_PATH_ENV = "ROLLFLOW_REWARD_SYS_PATH"


def _exit_with_parent(parent_pid: int) -> None:
    """A reward that hangs would outlive a killed parent; poll and leave with it."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def _score(fn: Any, request: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = {"id": request["id"]}
    try:
        value = fn(request["prompt"], request["completion"], request["answer"], **request["data"])
    except Exception:
        reply["error"] = traceback.format_exc(limit=8)
        return reply
    try:
        reply["score"] = check_reward(value)
    except RewardValueError as exc:
        reply["error"] = str(exc)
    return reply


def main(argv: list[str]) -> int:
    spec, read_fd, write_fd = argv[0], int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    for entry in reversed(json.loads(os.environ.get(SYS_PATH_ENV, "[]"))):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    requests = os.fdopen(read_fd, "rb")
    replies = os.fdopen(write_fd, "wb", buffering=0)
    try:
        fn = import_string(spec)
    except BaseException as exc:  # report any import failure instead of dying silently
        replies.write(
            json.dumps({"error": f"cannot import reward function {spec!r}: {exc!r}"}).encode() + b"\n"
        )
        return 1
    replies.write(b'{"ready": true}\n')
    for line in requests:
        replies.write(json.dumps(_score(fn, json.loads(line))).encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
