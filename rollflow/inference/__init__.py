"""Talking to inference engines: one contract, one implementation per engine, the client and the watcher.

``contract.Engine`` (generate with per-token logprobs and versions, pause / resume, load weights from a
checkpoint directory, abort, health, launch line); ``sglang.LocalEngine`` / ``sglang.SGLangEngine`` /
``vllm.VLLMEngine`` implement it and ``engines.engine_for`` picks one from ``inference.backend``.
``client.EngineClient`` generates through any of them (routing in ``routing.py``), ``watcher.CheckpointWatcher``
keeps them on the newest checkpoint (server bookkeeping in ``fleet_health.py``). docs/inference.md.
"""
