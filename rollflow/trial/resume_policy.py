"""How a trial resumes: the config a resume runs with, what it may change, and how it is recorded.

What it is:

* ``resume_config(record, fresh, overrides, trained_version)``: the config a resume runs with. It is the
  recorded config (``rollflow.trial.record``), not the YAML read again: a trial started with
  ``train.steps=200`` resumes with 200 whatever the YAML says now. On top of it:
  - credentials come from the present config (the environment, the YAML), never from the record;
  - the resume's own ``overrides`` (dotted, explicit) apply (one that repeats the recorded value, e.g.
    ``storage.root`` to find the trial, is not a change), except where they would make the record
    false: a key that defines the data, the model or where the trial lives (``RECORD_KEYS``:
    ``experiment``, ``seed``, ``model.*``, ``dataset.*``, ``eval.split``, ``eval.n_prompts``,
    ``eval.correct_reward``, ``storage.root``, ``train.lora.*``, ``train.warm_start_from.*``), or a
    ``train.steps`` below the version already trained. Those raise ``ResumeOverrideError`` (a
    ``ConfigError``) saying what to do instead;
  - keys where the present YAML differs from the record without an override are reported
    (``ResumedConfig.ignored``) so the flow can say that the record won.
* ``settle_config``: the same for a trial in any state (new, unfinished, trained, finished), recording
  the result (``record_resume``) unless asked only to look (``write=False``: the command line's check).
* ``recorded_config``: the trial's recorded config with a reader's own overrides on top (what an evaluation
  or ``rollflow query/view/replay`` of the trial uses: its data, model and evaluation set);
* ``resume_tags`` / ``pinned_overrides``: the resume's overrides as MLflow tags, and the overrides that
  make a child process (distributed mode) resolve the same config.

What it is not: the record's file (``rollflow.trial.record``), trial selection (``rollflow.trial.choice``)
or MLflow (the flow tags the run). Nothing here imports Prefect.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ResumeOverrideError
from rollflow.configuration.loader import flatten, load_config, parse_override, redacted_dict, to_dict
from rollflow.configuration.redact import REDACTED
from rollflow.trial.record import read_config_record, record_resume, resume_overrides, write_config_record
from rollflow.trial.store import open_trial_storage
from storage.fs import Storage

log = logging.getLogger(__name__)

# keys whose change on a resume would make the trial's record false: its data, its model, its eval set
RECORD_KEYS = (
    "experiment",
    "seed",
    "model.",
    "dataset.",
    "eval.split",
    "eval.n_prompts",
    "eval.correct_reward",
    "storage.root",
    "train.lora.",
    "train.warm_start_from.",  # where the first steps' data came from (record/warm-start.json)
)


@dataclass(frozen=True)
class ResumedConfig:
    cfg: ExperimentConfig
    overrides: list[str]  # the resume's explicit overrides that change the record, as given
    ignored: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (recorded, present config)
    history: list[str] = field(default_factory=list)  # every resume's overrides so far, oldest first


def _has_secret(value: Any) -> bool:
    return REDACTED in str(value)


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = copy.deepcopy(value)
    return tree


def _check_override(key: str, value: Any, trained_version: int) -> None:
    if any(key == k or key.startswith(k) for k in RECORD_KEYS if k.endswith(".")) or key in RECORD_KEYS:
        raise ResumeOverrideError(
            key,
            "cannot change on resume: it defines the trial's data, model or evaluation set, which the "
            "trial already recorded. Start a new trial (leave trial= unset) to change it",
        )
    if key == "train.steps" and isinstance(value, int) and value < trained_version:
        raise ResumeOverrideError(
            key,
            f"{value} is below the {trained_version} steps this trial already trained; a resume can only "
            f"keep or extend the run (train.steps >= {trained_version})",
        )


def resume_config(
    record: dict[str, Any], fresh: ExperimentConfig, overrides: Sequence[str], *, trained_version: int
) -> ResumedConfig:
    """The config to resume with (module docstring). ``fresh``: the config resolved now from the YAML (or
    settings) and the overrides; ``overrides``: the resume's explicit ones (``resume_overrides``).

    Raises:
        ResumeOverrideError: an override would change a recorded key (``RECORD_KEYS``) or shorten the run.
    """
    given = resume_overrides(overrides)
    stored = flatten(record["config"])
    present_raw = flatten(to_dict(fresh))
    present = flatten(redacted_dict(fresh))
    flat = {k: v for k, v in stored.items() if not _has_secret(v)}
    for key, value in present.items():  # credentials: from now, never from the record
        if _has_secret(value):
            flat[key] = present_raw[key]
    flat["trial"] = fresh.trial
    overridden: set[str] = set()
    changes: list[str] = []
    last: dict[str, tuple[str, object]] = {}  # a key given twice: the later value wins, as in load_config
    for item in given:
        path, value = parse_override(item)
        last.pop(".".join(path), None)
        last[".".join(path)] = (item, value)
    for key, (item, value) in last.items():
        if key in stored and stored[key] == value:
            continue  # the recorded value again (e.g. storage.root, to find the trial): not a change
        _check_override(key, value, trained_version)
        changes.append(item)
        for old in [k for k in flat if k == key or k.startswith(key + ".")]:
            del flat[old]
        flat[key] = value
        overridden.add(key)
    cfg = load_config(data=_unflatten(flat))
    if cfg.train.steps < trained_version:  # e.g. a train.* override that sets steps through another path
        raise ResumeOverrideError(
            "train.steps", f"{cfg.train.steps} is below the {trained_version} steps trained"
        )
    ignored = {
        k: (stored[k], present[k])
        for k in sorted(set(stored) & set(present))
        if k != "trial" and k not in overridden and stored[k] != present[k] and not _has_secret(present[k])
    }
    return ResumedConfig(cfg, changes, ignored)


def settle_config(
    storage: Storage,
    cfg: ExperimentConfig,
    *,
    state: str,
    overrides: Sequence[str],
    warn: Callable[[str], None] | None = None,
    write: bool = True,
) -> ResumedConfig:
    """The config a run of a trial in ``state`` (``rollflow.trial.choice.TrialState``) runs with: a new trial's
    ``cfg``, recorded now; an unfinished or trained one's record with the resume's ``overrides`` on top
    (recorded again with them); a finished one's record as it is (its resume only reports it: nothing is
    recorded). A trial that has no record (made before records existed) keeps ``cfg`` and records it, so
    its next resume has one (a finished one is left as it is). ``write=False`` decides the same and
    raises the same errors, but records and says nothing (the command line's check before the flow).

    Raises:
        ResumeOverrideError: see ``resume_config``; also a longer ``train.steps`` for a trained trial, and
            any override that would change a finished trial (the message says how to train it further).
    """
    from storage.checkpoints import CheckpointStore

    record = read_config_record(storage) if state != "new" else None
    if record is None:
        if state != "finished" and write:
            write_config_record(storage, cfg)
        return ResumedConfig(cfg, resume_overrides(overrides) if state != "new" else [])
    trained = CheckpointStore(storage).latest_version() or 0
    resumed = resume_config(record, cfg, overrides, trained_version=trained)
    if state == "finished":
        if resumed.overrides:
            raise ResumeOverrideError(
                resumed.overrides[0].split("=", 1)[0].strip(),
                f"trial {cfg.trial} is finished (trained to v{trained} and finalized); a resume only reports "
                f"it. To train it further, start a new trial from its last checkpoint: `rollflow run --config "
                f"<yours> model.path={storage.root_uri}/checkpoints/v{trained:06d} "
                f"{' '.join(resumed.overrides)}` (or, from the registered policy, retrain_from_registry)",
            )
        return ResumedConfig(resumed.cfg, [], resumed.ignored)
    if state == "trained" and resumed.cfg.train.steps != record["config"].get("train", {}).get("steps"):
        raise ResumeOverrideError(
            "train.steps",
            "this trial finished training (trainer/DONE.json); a resume only finalizes it. Start a new trial "
            "(retrain_from_registry, or model.path at its checkpoint) to train further",
        )
    if not write:
        return resumed
    record_resume(storage, record, resumed.cfg, resumed.overrides)
    history = [o for r in record.get("resumes", []) for o in r.get("overrides", [])] + resumed.overrides
    say = warn or log.warning
    if resumed.ignored:
        kept = ", ".join(f"{k}={rec!r} (config now: {now!r})" for k, (rec, now) in resumed.ignored.items())
        say(
            f"resuming {cfg.trial} with its recorded config, not the config file's: {kept}; to change a key, "
            "pass it as an override on resume"
        )
    if resumed.overrides:
        say(f"resume overrides of {cfg.trial}: {' '.join(resumed.overrides)} (recorded with the trial)")
    return ResumedConfig(resumed.cfg, resumed.overrides, resumed.ignored, history)


def recorded_config(cfg: ExperimentConfig, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The recorded config of ``cfg``'s trial with ``overrides`` on top; ``cfg`` for a trial without a record."""
    record = read_config_record(open_trial_storage(cfg))
    if record is None:
        return cfg
    recorded = resume_config(record, cfg, [], trained_version=0).cfg
    given = resume_overrides(overrides)
    return load_config(data=to_dict(recorded), overrides=given) if given else recorded


def resume_tags(resumed: ResumedConfig) -> dict[str, str]:
    """MLflow run tags: every override given on a resume of this trial, oldest first (MLflow params are
    immutable, so a changed ``train.steps`` shows here, not in the params)."""
    return {"rollflow.resume.overrides": " ".join(resumed.history)} if resumed.history else {}


def pinned_overrides(resumed: ResumedConfig) -> list[str]:
    """Dotted overrides that make a config resolved from the YAML equal the recorded one (for processes
    that resolve it again, e.g. distributed mode's children): the recorded value of every ignored key."""
    return [f"{k}={json.dumps(recorded)}" for k, (recorded, _) in resumed.ignored.items()]
