"""``RLRun``: rollflow from Python in a few lines - a model, a dataset, a reward callable, then ``train()``.

What it is: a thin front over the same flows the CLI and the deployments run (``async-rl``,
``evaluate``), for notebooks and scripts::

    from flows import RLRun

    run = RLRun(model="Qwen/Qwen2.5-0.5B-Instruct", dataset=rows, reward_fn=my_reward, config={"train.steps": 50})
    summary = run.train()        # the async-rl flow, in this process (a private Prefect API if none is set)
    run.evaluate()               # score the latest checkpoint on the held-out rows
    run.trajectories(limit=8)    # the newest trajectories, read from the Parquet shards
    run.query("SELECT * FROM per_version")  # SQL over every committed rollout (docs/trajectories.md)
    run.submit()                 # or: hand the same settings to the `async-rl/local` deployment

It only turns Python objects into an ``ExperimentConfig``; there is no second code path:

* ``dataset``: a list of dicts, a ``datasets.Dataset`` / ``DatasetDict`` (splits ``train`` and ``test``)
  or a path/glob the ``files`` loader reads. In-memory rows are written once as JSONL under
  ``runs/datasets/<content hash>/`` and the config points a ``files`` dataset at them.
  Relative paths (these, the config's ``runs/storage``, a model directory) are the project directory's
  (``rollflow.configuration.project_dir``: ``$ROLLFLOW_PROJECT_DIR``, else the current directory), the
  same rule ``rollflow ls`` / ``resume`` / ``query`` follow, so they find the trial there. Without
  ``eval_dataset`` (or a ``test`` split), a seeded tenth of the rows (at most 200) is held out.
  Columns: ``messages`` (chat messages) or ``prompt`` / ``question`` (text), and ``answer``.
* ``reward_fn``: ``fn(prompt, completion, answer, **data) -> float`` or ``"pkg.module:name"``. A function
  importable by name runs in reward worker processes, as from YAML; one defined in a notebook cell, a
  lambda or a closure runs in this process on threads, with the same timeout
  (``rollflow.rewards.inprocess``), and ``submit()`` refuses it.
* ``config``: a YAML path, an ``ExperimentConfig``, or a dict (nested, or dotted keys such as
  ``{"train.steps": 50}``); ``model``, ``dataset`` and ``reward_fn`` go on top.

Why ``flows``, not ``rollflow``: it runs Prefect flows, and ``rollflow/`` never imports prefect (the core
runs without it), as ``rollflow``'s CLI lives in ``flows/cli/``.
What it is not: a trainer object that holds a model in memory; every call goes through storage, the
flows and MLflow, exactly as a deployment run does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from rollflow.api.config import ExperimentConfig, ReasoningGymConfig
from rollflow.api.errors import RollflowError
from rollflow.configuration.loader import load_config, read_yaml, to_dict
from rollflow.configuration.project_dir import in_project
from rollflow.rewards.inprocess import is_in_process, register_reward
from rollflow.rewards.protocol import reward_fn_name
from rollflow.trial.store import open_trial_storage

if TYPE_CHECKING:
    import pandas as pd
    from prefect.client.schemas.objects import FlowRun

# What RLRun takes as data: rows (a list of dicts, a ``datasets.Dataset``), a ``DatasetDict`` of such
# splits, or a file path.
Rows: TypeAlias = Iterable[Mapping[str, Any]]
DatasetInput: TypeAlias = Rows | Mapping[str, Rows] | str | Path

DATASETS_DIR = Path("runs/datasets")
# What RLRun fetches of a hub model: config, tokenizer, chat template and safetensors weights (never a
# pickled .bin: no pickle on the data path).
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
MAX_HELD_OUT = 200


class SessionError(RollflowError, ValueError):
    """An argument of ``RLRun`` that cannot become a run, with what to do instead."""


def _dotted_to_tree(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SessionError(f"config key {key!r} goes through {part!r}, which is a value")
        if isinstance(value, Mapping):
            node.setdefault(leaf, {}).update(_dotted_to_tree(value))
        else:
            node[leaf] = value
    return tree


def _rows(data: DatasetInput, what: str) -> list[dict[str, Any]]:
    """A list of plain dicts from a list of dicts or a ``datasets.Dataset``."""
    if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
        rows = data.to_list()
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        rows = list(data)
    else:
        raise SessionError(
            f"{what} must be a list of dicts, a datasets.Dataset/DatasetDict or a file path, got {type(data).__name__}"
        )
    if not rows:
        raise SessionError(f"{what} is empty")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise SessionError(f"{what}[{bad}] is {type(rows[bad]).__name__}, not a dict of columns")
    return [dict(r) for r in rows]


def _fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset config fields that read these rows (the first row decides)."""
    cols = set(rows[0])
    if "answer" not in cols:
        raise SessionError(
            f"dataset rows need an 'answer' column (the reference passed to the reward); they have {sorted(cols)}"
        )
    if "messages" in cols:
        return {"messages_field": "messages", "answer_field": "answer"}
    for name in ("prompt", "question"):
        if name in cols:
            return {"prompt_field": name, "answer_field": "answer"}
    raise SessionError(
        f"dataset rows need a 'messages' (chat) or 'prompt'/'question' (text) column; they have {sorted(cols)}"
    )


def _write_jsonl(splits: dict[str, list[dict[str, Any]]], root: Path) -> dict[str, Path]:
    """Write each split once under ``root/<content hash>/`` and return the paths."""
    body = {
        name: "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        for name, rows in splits.items()
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    folder = root / digest
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in body.items():
        path = folder / f"{name}.jsonl"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        paths[name] = path.resolve()
    return paths


def dataset_tree(
    dataset: DatasetInput, eval_dataset: DatasetInput | None, *, seed: int, root: Path = DATASETS_DIR
) -> dict[str, Any]:
    """The ``dataset`` config section for ``dataset`` (module docstring)."""
    if isinstance(dataset, (str, Path)):
        tree: dict[str, Any] = {"kind": "files", "path": str(dataset)}
        if eval_dataset is not None:
            if not isinstance(eval_dataset, (str, Path)):
                raise SessionError("with a dataset path, eval_dataset must be a path too")
            tree["path"] = f"train={dataset},test={eval_dataset}"
        return tree
    if hasattr(dataset, "keys") and hasattr(dataset, "column_names") and not hasattr(dataset, "to_list"):
        if "train" not in dataset:  # a DatasetDict
            raise SessionError(f"a DatasetDict needs a 'train' split; it has {sorted(dataset.keys())}")
        eval_dataset = eval_dataset if eval_dataset is not None else dataset.get("test")
        dataset = dataset["train"]
    train = _rows(dataset, "dataset")
    if eval_dataset is not None:
        test = _rows(eval_dataset, "eval_dataset")
    else:
        if len(train) < 2:
            raise SessionError("dataset needs at least 2 rows to hold some out, or pass eval_dataset")
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        n_test = min(MAX_HELD_OUT, max(1, len(train) // 10))
        held = set(order[:n_test])
        test = [r for i, r in enumerate(train) if i in held]
        train = [r for i, r in enumerate(train) if i not in held]
    paths = _write_jsonl({"train": train, "test": test}, root)
    return {
        "kind": "files",
        "path": f"train={paths['train']},test={paths['test']}",
        "format": "json",
        "train_split": "train",
        "eval_split": "test",
        **_fields(train),
    }


def model_settings(model: str | Path, *, bootstrap: bool) -> dict[str, Any]:
    """The ``model`` settings for ``RLRun(model=...)``: a directory, or a hub id as ``transformers`` takes.

    * an existing directory: used as it is (``bootstrap_tiny`` off, so nothing is built over it);
    * a directory that does not exist yet, with ``model.bootstrap_tiny`` on in the config: the tiny
      model is built there;
    * ``org/name`` (one ``/``, no such directory): a Hugging Face hub id, downloaded (or found in the
      hub cache) with ``huggingface_hub.snapshot_download``, weights as safetensors only; offline and
      not cached, that call raises the library's own error (``LocalEntryNotFoundError``);
    * anything else: ``SessionError`` saying what to pass.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return {"path": str(path.resolve()), "bootstrap_tiny": False}
    if bootstrap:
        return {"path": str(path.resolve())}
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/")):
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id=text, allow_patterns=HUB_FILES)
        return {"path": local, "bootstrap_tiny": False}
    raise SessionError(
        f"model {text!r} is neither a directory nor a hub id ('org/name'); pass a Hugging Face model "
        "directory or hub id, or build the tiny model there with "
        "config={'model.bootstrap_tiny': True}"
    )


def default_experiment(model_path: str | None) -> str:
    """``rlrun-<name of the model directory>``: a run from Python gets an experiment of its own."""
    name = Path(model_path or ExperimentConfig().model.path).name
    return "rlrun-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "model")


def reward_spec(reward_fn: Callable[..., float] | str) -> str:
    """The import string for ``reward_fn``: its own name when importable, else an in-process one."""
    if isinstance(reward_fn, str):
        return reward_fn
    try:
        return reward_fn_name(reward_fn)
    except Exception:  # defined in a notebook cell, a lambda, a closure: this process only
        return register_reward(reward_fn)


class RLRun:
    """One trial, driven from Python (module docstring).

    Args:
        model: a Hugging Face model directory or hub id ``org/name`` (``model_settings``; None keeps the
            config's).
        dataset: rows, a ``datasets.Dataset``/``DatasetDict``, a file path, or a ``ReasoningGymConfig``
            (a reasoning-gym generator as prompts and reward; None keeps the config's).
        reward_fn: a callable or ``"pkg.module:name"`` (None keeps the config's).
        config: a YAML path, an ``ExperimentConfig`` or a dict of settings.
        eval_dataset: held-out rows (default: a seeded tenth of ``dataset``, at most 200).
        trial: the trial name (default: a new one per ``train()``, as the CLI does).
        experiment: the experiment (MLflow experiment, storage prefix, registered model
            ``<experiment>-policy``); default: the config's, else ``rlrun-<model directory name>``, so a
            run from Python never lands in the demo's experiment.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dataset: DatasetInput | None = None,
        reward_fn: Callable[..., float] | str | None = None,
        config: str | Path | ExperimentConfig | Mapping[str, Any] | None = None,
        *,
        eval_dataset: DatasetInput | None = None,
        trial: str | None = None,
        experiment: str | None = None,
    ) -> None:
        with in_project():  # relative paths (a YAML, the model, runs/datasets) are the project's
            self.settings: ExperimentConfig = self._settings(
                model, dataset, reward_fn, config, eval_dataset, trial, experiment
            )
        self.trial: str | None = trial
        self.summary: dict[str, Any] | None = None

    @staticmethod
    def _settings(
        model: str | Path | None,
        dataset: DatasetInput | None,
        reward_fn: Callable[..., float] | str | None,
        config: str | Path | ExperimentConfig | Mapping[str, Any] | None,
        eval_dataset: DatasetInput | None,
        trial: str | None,
        experiment: str | None,
    ) -> ExperimentConfig:
        """The ``ExperimentConfig`` of these arguments (class docstring)."""
        if isinstance(config, ExperimentConfig):
            tree = to_dict(config)
        elif isinstance(config, Mapping):
            tree = _dotted_to_tree(config)
        elif config is not None:
            tree = read_yaml(config)  # validated below, with everything on top (load_config)
        else:
            tree = {}
        if model is not None:
            section = tree.setdefault("model", {})
            section.update(model_settings(model, bootstrap=bool(section.get("bootstrap_tiny"))))
        if experiment is not None:
            tree["experiment"] = experiment
        elif not isinstance(config, ExperimentConfig) and "experiment" not in tree:
            tree["experiment"] = default_experiment(tree.get("model", {}).get("path"))
        seed = int(tree.get("seed", ExperimentConfig().seed))
        if isinstance(dataset, ReasoningGymConfig):  # a reasoning-gym task, scored by its own verifier
            section = tree.setdefault("dataset", {})
            section.update({"kind": "reasoning_gym", "reasoning_gym": dataclasses.asdict(dataset)})
        elif dataset is not None:
            section = tree.setdefault("dataset", {})
            section.update(dataset_tree(dataset, eval_dataset, seed=seed))
        if reward_fn is not None:
            tree.setdefault("dataset", {})["reward_fn"] = reward_spec(reward_fn)
        if trial is not None:
            tree["trial"] = trial
        elif not isinstance(config, ExperimentConfig) and "trial" not in tree:
            tree["trial"] = "rlrun"  # new trials are rlrun-<date>-<time>-<hex>
        return load_config(data=tree)

    @property
    def in_process_reward(self) -> bool:
        return is_in_process(self.settings.dataset.reward_fn)

    def _cfg(self) -> ExperimentConfig:
        return self.settings if self.trial is None else dataclasses.replace(self.settings, trial=self.trial)

    def train(self, *, resume: bool = False) -> dict[str, Any]:
        """Run the ``async-rl`` flow in this process; returns its summary (and remembers the trial)."""
        from flows.async_rl import async_rl
        from flows.local_api import local_prefect_api
        from rollflow.trial.kept import rlrun_kept_line
        from rollflow.trial.naming import expand_trial_name, fresh_trial_name

        # named before the flow starts, so that Ctrl-C can say which trial it kept
        trial = expand_trial_name(self.trial) if self.trial else fresh_trial_name(self.settings.trial)
        try:
            with in_project(), local_prefect_api():
                summary = async_rl(settings=self.settings, trial=trial, resume=resume)
        except KeyboardInterrupt:
            with in_project():
                print(rlrun_kept_line(self.settings, trial), file=sys.stderr, flush=True)
            raise
        self.trial, self.summary = summary["trial"], summary
        return summary

    def evaluate(self, version: int = -1, split: str | None = None) -> dict[str, Any]:
        """Score checkpoint ``version`` (-1 = the latest) of this run's trial (the ``evaluate`` flow)."""
        if self.trial is None:
            raise SessionError("this RLRun has no trial yet: call train() first, or pass trial=")
        from flows.evaluate import evaluate
        from flows.local_api import local_prefect_api

        with in_project(), local_prefect_api():
            return evaluate(config=None, settings=self._cfg(), version=version, split=split)

    def trajectories(self, limit: int = 20) -> list[dict[str, Any]] | pd.DataFrame:
        """The newest ``limit`` trajectories from the shards (a pandas DataFrame when pandas is there)."""
        if self.trial is None:
            raise SessionError("this RLRun has no trial yet: call train() first, or pass trial=")
        from rollflow.rollout.inspect import sample_trajectories

        cfg = self._cfg()
        with in_project():
            rows = sample_trajectories(open_trial_storage(cfg), cfg.model.path, limit=limit)
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows)

    def query(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        """SQL over this run's committed trajectories, as a DataFrame (views: docs/trajectories.md), e.g.
        ``run.query("SELECT version, reward_mean, staleness_mean FROM per_version")``."""
        if self.trial is None:
            raise SessionError("this RLRun has no trial yet: call train() first, or pass trial=")
        from rollflow.viewer.trial import query_trial

        with in_project():
            return query_trial(self._cfg(), sql, params).to_pandas()

    def submit(self, deployment: str = "async-rl/local", *, wait: bool = False) -> FlowRun:
        """Start a run of ``deployment`` with these settings; returns the flow run (finished if ``wait``)."""
        if self.in_process_reward:
            raise SessionError(
                f"the reward {self.settings.dataset.reward_fn!r} was defined in this process (a notebook "
                "cell, a lambda or a closure), so a deployment's flow run cannot call it: define it at "
                "the top level of an importable module and pass it (or 'pkg.module:name'), or use train()"
            )
        from prefect.deployments import run_deployment

        params: dict[str, Any] = {"settings": to_dict(self.settings)}
        if self.trial is not None:
            params["trial"] = self.trial
        # _sync: a plain call also inside a running event loop (a notebook kernel), where Prefect's
        # sync_compatible would hand back a coroutine
        return run_deployment(deployment, parameters=params, timeout=None if wait else 0, _sync=True)
