"""rollflow's CPU inference server: SGLang 0.5.23's native HTTP protocol over a transformers model.

What it is: a stand-in for SGLang on machines without a GPU (development, CI, the embedded default), so
the same client (``rollflow.inference.client``), checkpoint watcher and tests run against either. Continuous
batching with a KV cache (``engine``), SGLang's sampling and logprob semantics (``sampling``), checked
in-place weight swaps (``weights``), the HTTP routes (``app``).

What it is not: a production server. No streaming, no prefix cache, no tensor parallelism.

Run::

    python -m infra.cpu_server --model-path runs/models/tiny --port 30000 [--host 127.0.0.1]
        [--api-key KEY | env ROLLFLOW_INFERENCE_API_KEY] [--max-batch-size 64] [--threads 1]
        [--weight-version 0] [--weights-root DIR ...] [--allow-unauthenticated]

To start N of them as child processes, use ``infra.servers.launch_local_servers``.
"""
