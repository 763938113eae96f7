"""The learning suite: rollflow's defaults against TRL on families nobody tuned on (``make bench-suite``).

Families (``families.py``), each warm-started on an easier setting of its own task so the starting policy
scores 0.1-0.4 held out, with held-out problems it solves and problems it does not: four reasoning-gym
generators, ``add_gap`` and the outside-built ``sub_gap``. Each family is **dev** (defaults may be tuned
on it) or **test** (never looked at while tuning); the split is written in docs/benchmarks.md ("The
suite"), before any tuning. ``run.py`` runs ``bench.peer`` per family (TRL and rollflow, one after the
other per seed, at the candidate defaults: every learning key at the config class's default, whatever
the family's config sets) and ``report.py`` prints one table and draws one picture.

What it is not: a test, or a tuner. It measures; the rule for defaults (docs/learning.md) decides.
"""
