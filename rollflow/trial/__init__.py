"""The trial's room: one trial, from its name to its finalization record, without Prefect.

A trial is one run of an experiment, stored under ``{root}/{experiment}/{trial}/``. Its pieces:

- ``naming``: its name (``{date}`` expanded, or a fresh ``{config trial}-{date}-{time}-{hex}``);
- ``choice``: its state (new, unfinished, trained, finished) and whether a run may work on it;
- ``opening``: ``open_trial``, the one entry: name, choice and the config the trial runs with;
- ``record`` / ``resume_policy``: its config record, and what a resume runs with;
- ``evaluations`` / ``base_split``: its evaluation records and the split of what the start solved;
- ``retrain``: a new trial that starts from the registered policy;
- ``auto_resume``: the budget of automatic resumes and the failures a resume cannot heal;
- ``preflight``: the command line's check before Prefect starts (``open_trial`` without writing);
- ``lineage``, ``summary``, ``finalization``: its MLflow tags, its summary, and the record that it is whole;
- ``kept``: what a stopped trial kept, and the command that resumes it;
- ``store``: ``open_trial_storage``, its storage.

What it is not: Prefect (the flows and tasks call in here) or the storage layout (``storage.keys``).
"""
