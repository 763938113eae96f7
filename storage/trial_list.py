"""The trials stored under one experiment and what storage tells of each (``rollflow ls``).

What it is: ``list_trials(root, experiment, options, active_within_s=...)`` returns one ``TrialInfo`` per
trial directory under ``{root}/{experiment}/`` (name, status, latest version, best recorded held-out
accuracy) and ``format_trials`` renders them; ``trial_names`` is the bare listing. The status comes from
the records a trial holds (``storage.finalization`` has the table) and, for an unfinished trial, from how
fresh its heartbeats are:

    finalized   FINALIZED.json: final evaluation, registry decision and MLflow run end recorded
    trained     trainer/DONE.json without FINALIZED.json: a resume finalizes it
    running     neither, and a rollout worker's heartbeat (``updated_at`` in rollout/state-*.json) or the
                newest checkpoint (checkpoints/LATEST) is younger than ``active_within_s`` (the config's
                ``rollout.worker_lease_s``: the age at which workers call each other dead)
    stopped     neither, and quiet for longer: it failed, was killed or was interrupted (storage cannot
                tell which; the MLflow run's status can); ``rollflow resume NAME`` continues it

The version is the newest published checkpoint (LATEST), else the trainer's done marker's, else
FINALIZED.json's. The accuracy is the best held-out accuracy among the trial's evaluation records
(``eval/v{N}.json``, one per scored version), else the final one in FINALIZED.json, else unknown.

What it is not: a reader of trajectories (``rollflow.rollout.inspect``) or of MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storage import keys
from storage.checkpoints import CheckpointStore
from storage.finalization import read_finalized
from storage.fs import Storage

TrialStatus = Literal["finalized", "trained", "running", "stopped"]
_PROBE = "_"  # a valid trial name, only to reach the experiment directory


@dataclass(frozen=True)
class TrialInfo:
    name: str
    status: TrialStatus
    version: int | None  # newest published checkpoint
    best_accuracy: float | None  # best recorded held-out accuracy
    best_at: int | None  # the version that scored it (None: only the final score is known)


def _experiment_dir(root: str, experiment: str, options: Mapping[str, Any] | None) -> tuple[Storage, str]:
    probe = Storage.open(root, experiment, _PROBE, options)
    return probe, probe.base.rsplit("/", 1)[0]


def experiment_uri(root: str, experiment: str, options: Mapping[str, Any] | None = None) -> str:
    """``{root}/{experiment}`` as a URI without credentials (for messages)."""
    return Storage.open(root, experiment, _PROBE, options).root_uri.rsplit("/", 1)[0]


def trial_names(root: str, experiment: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """The trial directories under ``{root}/{experiment}/``, sorted; [] when there are none."""
    probe, parent = _experiment_dir(root, experiment, options)
    try:
        entries = probe.fs.ls(parent, detail=True)
    except FileNotFoundError:
        return []
    names = (str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    return sorted(n for n in names if not n.startswith("."))


def _heartbeat(storage: Storage) -> float | None:
    """The newest sign of life: a rollout worker's ``updated_at``, or when LATEST was written."""
    seen = [storage.modified_at(keys.LATEST_KEY)]
    for key in storage.list(keys.ROLLOUT_DIR):
        name = key.rsplit("/", 1)[-1]
        if name.startswith("state-") and name.endswith(".json"):
            try:
                seen.append(float(storage.get_json(key).get("updated_at")))
            except (FileNotFoundError, ValueError, TypeError, AttributeError):
                continue
    stamps = [t for t in seen if t is not None]
    return max(stamps) if stamps else None


def _best_accuracy(storage: Storage, finalized: Mapping[str, Any] | None) -> tuple[float | None, int | None]:
    best: tuple[float | None, int | None] = (None, None)
    for key in storage.list(keys.EVAL_DIR):
        try:
            doc = storage.get_json(key)
            acc, version = float(doc["accuracy"]), int(doc["version"])
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            continue
        if best[0] is None or acc > best[0]:
            best = (acc, version)
    if best[0] is None and finalized and finalized.get("eval_accuracy_after") is not None:
        return float(finalized["eval_accuracy_after"]), finalized.get("final_version")
    return best


def trial_info(storage: Storage, name: str, *, active_within_s: float, now: float | None = None) -> TrialInfo:
    """What storage tells of one trial (see the module docstring)."""
    store = CheckpointStore(storage)
    finalized = read_finalized(storage)
    done = store.is_done()
    version = store.latest_version()
    if version is None and done is not None:
        version = int(done.get("version", 0))
    if version is None and finalized is not None and finalized.get("final_version") is not None:
        version = int(finalized["final_version"])
    status: TrialStatus
    if finalized is not None:
        status = "finalized"
    elif done is not None:
        status = "trained"
    else:
        beat = _heartbeat(storage)
        now = time.time() if now is None else now
        status = "running" if beat is not None and now - beat < active_within_s else "stopped"
    acc, at = _best_accuracy(storage, finalized)
    return TrialInfo(name, status, version, acc, at)


def list_trials(
    root: str,
    experiment: str,
    options: Mapping[str, Any] | None = None,
    *,
    active_within_s: float = 60.0,
    now: float | None = None,
) -> list[TrialInfo]:
    """One ``TrialInfo`` per trial under ``{root}/{experiment}/``, sorted by name."""
    return [
        trial_info(
            Storage.open(root, experiment, name, options), name, active_within_s=active_within_s, now=now
        )
        for name in trial_names(root, experiment, options)
    ]


def format_trials(trials: Sequence[TrialInfo]) -> str:
    """A fixed-width table: trial | status | version | best accuracy (and the version that scored it)."""
    width = max([len("trial"), *(len(t.name) for t in trials)])
    lines = [f"{'trial'.ljust(width)}  status     version  best accuracy"]
    for t in trials:
        version = "-" if t.version is None else str(t.version)
        acc = "-" if t.best_accuracy is None else f"{t.best_accuracy:.3f}"
        if t.best_accuracy is not None and t.best_at is not None:
            acc += f" (v{t.best_at})"
        lines.append(f"{t.name.ljust(width)}  {t.status.ljust(9)}  {version.ljust(7)}  {acc}")
    return "\n".join(lines)
