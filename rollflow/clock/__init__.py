"""Where a role's wall time goes: ``roles`` (``RoleClock``, ``Timeline``).

It sits below every role that keeps a clock (the checkpoint watcher in ``rollflow.inference``, the rollout,
the trainer); what samples and reports the clocks with the cores and servers is ``rollflow.timing``.
"""
