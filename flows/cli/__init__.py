"""The ``rollflow`` command: run, resume, evaluate, list and inspect trials, and plan the GPU path.

    rollflow run [--config C] [--trial T] [-v] [dotted.overrides ...]  a new trial (or the named one)
    rollflow resume TRIAL [--config C] [-v] [dotted.overrides ...]     continue TRIAL (a finished one: no-op)
    rollflow eval TRIAL [--config C] [--version V] [--split S]       score a checkpoint of TRIAL
    rollflow ls [--config C] [experiment=E ...]                      the trials of every experiment (or of E)
    rollflow inspect TRIAL [--config C] [--min-reward R] [--version LO:HI] [--prompt TEXT]
    rollflow plan [--config configs/gsm8k_qwen.yaml] --image IMG    the GPU path, resolved without a GPU

A trial is named the same way everywhere: the word after the command (``resume TRIAL``, ``eval TRIAL``,
``inspect TRIAL``); ``run --trial NAME`` names a new one. The old spellings ``eval --trial T`` and
``inspect trial=T`` still work and say so on stderr.

Where it looks: ``--config`` defaults to the demo's config (``configs/tiny_hard.yaml``, the one ``make demo``
trains), found in the checkout from any directory; a relative ``--config`` is looked up in the current
directory, then in the checkout. Relative paths inside the config (``storage.root: runs/storage``,
``model.path``) are relative to the project directory, as for ``RLRun``
(``rollflow.configuration.project_dir``): ``$ROLLFLOW_PROJECT_DIR`` when set, else the current directory.
So ``rollflow ls`` in a folder lists the trials made there, by ``make demo`` in the checkout or by an
``RLRun`` script in a folder of your own. ``resume`` and ``eval`` find a trial
stored under another experiment of the same root (``flows.cli.paths.find_experiment``); ``inspect`` decodes with the
tokenizer of the model the trial recorded.
    rollflow query TRIAL "SELECT ..." [--config C] [--format F]      SQL over the committed trajectories
    rollflow view TRIAL [--config C] [--port P] [--api-key K]        the trajectory viewer on 127.0.0.1
    rollflow replay TRIAL --to N [--config C] [--from-resume-point]  retrain to vN from the record, compare

``run``, ``resume`` and ``eval`` run the flows in this process: against ``PREFECT_API_URL`` when it is
set (the runs show in that server's UI), else against a private API server that dies with this process.
To run on a worker instead, use ``prefect deployment run 'async-rl/local'`` (docs/operations.md).
``ls`` and ``inspect`` read storage only and never import Prefect, so they answer in about a second;
``inspect`` on a trial that is not stored says ``no such trial: ...`` (status 2), which is not what it
says when the filters match nothing.

A command line that cannot work (an unknown config key, a trial that holds no data for ``resume`` or
already holds some for ``run --trial``, a checkpoint that is not there, ``plan`` without an image) ends
with one ``rollflow <command>: error: ...`` line saying what to type instead, and exit status 2; ``run``,
``resume`` and ``eval`` check their trial before they start Prefect (``rollflow/trial/preflight.py``). Ctrl-C
during ``run`` or ``resume`` prints one line (the trial kept, its resume point, the command that
resumes it) and exits with status 130 (``flows/cli/interrupt.py``).

It lives in ``flows/`` (not ``rollflow/``) because it calls flows, and ``rollflow/`` never imports Prefect.
Its modules: ``app`` (the parser and dispatch), ``paths`` (where configs and trials are found), ``run``
(``run``, ``resume``, ``eval``: the flows in this process), ``trials`` (``ls``, ``query``, ``view``,
``replay``), ``inspect_words`` (``inspect``'s words) and ``interrupt`` (Ctrl-C).
"""

from __future__ import annotations

from flows.cli.app import main

__all__ = ["main"]
