"""Where a run's time goes: each role's wall time in named states, every core's busy share, and a picture.

What it is: ``clock`` (``RoleClock``: one role's wall time split into named states, with its spans;
``Timeline``: the roles of one process, the policy versions on the same clock, and the JSON document;
both live in ``rollflow.clock.roles``, below the inference servers whose watcher keeps one), ``cpu`` (``CoreMeter``: each core's busy share from ``/proc/stat``; ``ServerMeter``: an inference
server's busy share and batch occupancy from its ``/get_server_info``), ``report`` (``TimingReporter``:
samples both and logs ``time/...`` metrics while a run goes) and ``plot`` (the timeline picture).
What it is not: a profiler (no stacks, no per-function time) nor a metrics store (it logs through a
``MetricsSink``); nothing here imports Prefect or MLflow.
"""
