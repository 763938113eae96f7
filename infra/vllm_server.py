"""``python -m infra.vllm_server ARGS``: vLLM's OpenAI API server, with a quiet stop.

What it is: runs ``vllm.entrypoints.openai.api_server`` (its own ``__main__``, same arguments) after one
change to its logging (kept across vLLM's own logging reconfigurations): once the server logs its own ``[shutdown]`` lines, the ``EngineDeadError``
traceback that vLLM 0.32's ``AsyncLLM.output_handler`` logs is dropped. vLLM stops its engine core before
it cancels that task, so the task sees the engine die and logs the death as a failure in about 4 of 10
stops (issue 25); before a shutdown began the same record is a real fault and is kept.

``--gpu-ids 1,2`` (rollflow's own flag, removed before vLLM parses its arguments) sets
``CUDA_VISIBLE_DEVICES`` before vLLM imports torch: vLLM has no ``--base-gpu-id``, so without it every
server would land on ``cuda:0``, beside the trainer (the launcher passes ``inference.vllm.base_gpu_id +
i * tp_size`` onward for server i).

What it is not: a vLLM fork or a change to anything else it logs. It runs in vLLM's own venv, so it
imports nothing of rollflow.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys


class QuietStop(logging.Filter):
    """Drops ``AsyncLLM output_handler failed`` (an ``EngineDeadError``) once a ``[shutdown]`` was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "[shutdown]" in message:
            self.stopping = True
            return True
        dead = record.exc_info is not None and type(record.exc_info[1]).__name__ == "EngineDeadError"
        return not (self.stopping and (dead or "EngineDeadError" in message))


def install() -> QuietStop:
    """Attach one ``QuietStop`` to every handler of vLLM's logger, now and after every reconfiguration.

    vLLM configures its logging when ``vllm.logger`` loads and again when the engine starts
    (``configure_logging`` from ``AsyncLLM``, a ``dictConfig`` that replaces the handlers), so the filter
    is re-attached after each ``_configure_vllm_root_logger`` call.
    """
    import vllm.logger  # (configures the "vllm" logger and its handlers)

    quiet = QuietStop()

    def attach() -> None:
        for handler in logging.getLogger("vllm").handlers + logging.getLogger().handlers:
            if quiet not in handler.filters:
                handler.addFilter(quiet)

    configure = vllm.logger._configure_vllm_root_logger

    def configure_then_attach(*args: object, **kwargs: object) -> None:
        configure(*args, **kwargs)
        attach()

    vllm.logger._configure_vllm_root_logger = configure_then_attach
    attach()
    return quiet


def take_gpu_ids(argv: list[str]) -> list[str]:
    """``argv`` without ``--gpu-ids X``; sets ``CUDA_VISIBLE_DEVICES=X`` when it was there."""
    if "--gpu-ids" not in argv:
        return argv
    i = argv.index("--gpu-ids")
    os.environ["CUDA_VISIBLE_DEVICES"] = argv[i + 1]
    return argv[:i] + argv[i + 2 :]


if __name__ == "__main__":
    sys.argv = take_gpu_ids(sys.argv)
    install()
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
