"""One MLflow run per trial: params, a metrics sink, artifacts and the model registry.

What it is: ``MlflowTracker`` wraps ``MlflowClient`` for the life of a trial. It logs the flattened,
secret-free config as params, hands out a thread-safe ``MetricsSink`` the loops report through,
logs the resolved config / curve PNG / sample trajectories as plain JSON and PNG artifacts, and logs the
final checkpoint as an MLflow chat model (``chat_model.py``) that the registry gate may register
(``registry.py``): a full model, or a LoRA adapter with its base's identity, under ``model_name``; a
LoRA run's merged model under ``merged_model_name``.
The experiment is tagged as model training (``mlflow.experimentKind``), and no table is logged through
``log_table``, so MLflow's UI never files the runs under its GenAI evaluation views.
What it is not: the source of any metric. It never imports prefect; Prefect artifacts live in tasks/.

Tracking URI: ``cfg.tracking.mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a SQLite file
``runs/mlflow/mlflow.db``. With any SQLite URI, artifacts go to ``artifacts/`` beside the database
file (never under the current directory). Run links point at the MLflow UI: the server itself for an
``http`` store, else ``$ROLLFLOW_MLFLOW_UI_URL`` (default ``http://127.0.0.1:5000``, where
``mlflow ui --backend-store-uri <uri>`` serves it).
"""

from __future__ import annotations

import io
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.configuration.loader import flat_params, to_yaml
from rollflow.tracking.base_model import BaseModelIdentity
from rollflow.tracking.chat_model import PolicyCard, log_chat_model
from rollflow.tracking.registry import Registry

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("runs/mlflow")
_PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
_METRIC_BATCH = 1000
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"  # not "genai_development": these are training runs


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``sqlite:////abs`` is absolute), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0]).resolve()


def resolve_tracking_uri(cfg: ExperimentConfig, base_dir: Path = DEFAULT_DIR) -> tuple[str, str | None]:
    """Return (tracking_uri, artifact_location or None when the store decides).

    A SQLite store keeps its artifacts in ``artifacts/`` beside the database file."""
    uri = cfg.tracking.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        base = base_dir.resolve()
        base.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{base / 'mlflow.db'}"
    db = sqlite_path(uri)
    if db is None:
        return uri, None  # a server or a file store chooses its own artifact root
    db.parent.mkdir(parents=True, exist_ok=True)
    return uri, (db.parent / "artifacts").as_uri()


def ui_base_url(tracking_uri: str) -> str:
    """Where a human opens the MLflow UI for this store."""
    if tracking_uri.startswith("http"):
        return tracking_uri.rstrip("/")
    return os.environ.get("ROLLFLOW_MLFLOW_UI_URL", "http://127.0.0.1:5000").rstrip("/")


class MlflowSink:
    """``MetricsSink`` that writes to one MLflow run; safe to call from several threads.

    Asynchronous by default (MLflow's own async logging, ``log_batch(synchronous=False)``): a step's
    metrics are queued and written by MLflow's background thread, so the trainer does not wait on the
    tracking store (a synchronous ``log_batch`` to a SQLite store took ~8 ms a step on a quiet machine and
    showed as ~17 % of the trainer's time, state ``other``, in ``make demo``'s timeline). ``flush()`` waits
    until everything queued is written; the tracker flushes before it reads metrics back or ends the run.
    A killed process loses what was still queued (at most the last second or so of metrics)."""

    def __init__(self, client: Any, run_id: str, prefix: str = "", *, synchronous: bool = False) -> None:
        self._client = client
        self._run_id = run_id
        self._prefix = prefix
        self._synchronous = synchronous
        self._lock = threading.Lock()
        self.history: dict[str, list[tuple[int | None, float]]] = {}

    def flush(self) -> None:
        """Wait until every queued metric is written (no-op when synchronous)."""
        if self._synchronous:
            return
        import mlflow

        try:
            mlflow.flush_async_logging()
        except Exception as exc:  # tracking must never kill training
            log.warning("MLflow async flush failed (%s); continuing", type(exc).__name__)

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        with self._lock:
            for name, value in metrics.items():
                v = float(value)
                if math.isnan(v) or math.isinf(v):
                    continue
                key = self._prefix + name
                self.history.setdefault(key, []).append((step, v))
                batch.append(Metric(key=key, value=v, timestamp=now, step=int(step or 0)))
        for i in range(0, len(batch), _METRIC_BATCH):
            try:
                self._client.log_batch(
                    self._run_id, metrics=batch[i : i + _METRIC_BATCH], synchronous=self._synchronous
                )
            except Exception as exc:  # tracking must never kill training
                log.warning("MLflow metric logging failed (%s); continuing", type(exc).__name__)


class MlflowTracker:
    def __init__(self, cfg: ExperimentConfig, *, base_dir: Path = DEFAULT_DIR) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.cfg = cfg
        self.tracking_uri, self._artifact_location = resolve_tracking_uri(cfg, base_dir)
        mlflow.set_tracking_uri(self.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_name = cfg.tracking.mlflow_experiment or cfg.experiment
        self.model_name = cfg.tracking.registered_model_name or f"{cfg.experiment}-policy"
        self.run_id: str | None = None
        self.sink: MlflowSink | None = None
        self._attached = False  # logging into a run someone else owns (see attach)

    # -- run lifecycle -----------------------------------------------------------------------
    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING:
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
            return exp.experiment_id
        return self.client.create_experiment(
            self.experiment_name,
            artifact_location=self._artifact_location,
            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING},
        )

    def find_run(self) -> Any | None:
        """The trial's existing run (read only), or None."""
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            return None
        runs = self.client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`rollflow.trial` = '{self.cfg.trial}'", max_results=1
        )
        return runs[0] if runs else None

    def start(self, *, tags: dict[str, str] | None = None) -> str:
        """Start (or resume, for the same trial) the trial's run and log the config as params."""
        exp_id = self._experiment_id()
        existing = self.find_run()
        if existing:
            self.run_id = existing.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            if tags:
                self.set_tags(tags)
        else:
            all_tags = {"rollflow.trial": self.cfg.trial, "rollflow.experiment": self.cfg.experiment}
            all_tags.update(tags or {})
            run = self.client.create_run(exp_id, run_name=self.cfg.trial, tags=all_tags)
            self.run_id = run.info.run_id
            self._log_params()
        self.sink = MlflowSink(self.client, self.run_id)
        self.client.log_text(self.run_id, to_yaml(self.cfg), "config/resolved.yaml")
        return self.run_id

    def attach(self, run_id: str) -> str:
        """Log into an existing run (a distributed child writing into its parent's run); ``finish`` then
        leaves the run's status to its owner."""
        self.run_id = run_id
        self.sink = MlflowSink(self.client, run_id)
        self._attached = True
        return run_id

    def start_nested(self, parent_run_id: str, name: str, *, tags: dict[str, str] | None = None) -> str:
        """Start (or resume, by ``name``) a child run nested under ``parent_run_id`` (MLflow's
        ``mlflow.parentRunId`` tag: the UI shows it under the parent). It has no ``rollflow.trial`` tag,
        so ``start`` never mistakes it for the trial's run."""
        exp_id = self.client.get_run(parent_run_id).info.experiment_id
        existing = self.client.search_runs(
            [exp_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`rollflow.role` = '{name}'",
            max_results=1,
        )
        if existing:
            self.run_id = existing[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            all_tags = {
                "mlflow.parentRunId": parent_run_id,
                "rollflow.role": name,
                "rollflow.parent_trial": self.cfg.trial,
                **(tags or {}),
            }
            self.run_id = self.client.create_run(exp_id, run_name=name, tags=all_tags).info.run_id
        self.sink = MlflowSink(self.client, self.run_id)
        return self.run_id

    def _log_params(self) -> None:
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in sorted(flat_params(self.cfg).items())]
        for i in range(0, len(params), _PARAM_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _PARAM_BATCH])

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED, or KILLED for a cancelled or interrupted run (queued metrics first)."""
        if self.sink is not None:
            self.sink.flush()
        if self.run_id is not None and not self._attached:
            self.client.set_terminated(self.run_id, status=status)

    @property
    def run_url(self) -> str:
        """An http link to the run in the MLflow UI (see the module docstring for non-http stores)."""
        exp_id = self._experiment_id()
        return f"{ui_base_url(self.tracking_uri)}/#/experiments/{exp_id}/runs/{self.run_id}"

    # -- artifacts ---------------------------------------------------------------------------
    def run_tags(self) -> dict[str, str]:
        """The tags of the trial's run as the store has them now ({} before ``start``)."""
        return {} if self.run_id is None else dict(self.client.get_run(self.run_id).data.tags)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_table(self, rows: Sequence[dict[str, Any]], artifact_file: str) -> None:
        """Rows as a JSON artifact ``{"columns": [...], "data": [[...], ...]}``.

        Plain ``log_dict``, not ``MlflowClient.log_table``: the latter tags the run as holding evaluation
        tables, and MLflow's UI then lists it among GenAI evaluation runs."""
        if not rows:
            return
        columns = list(rows[0])
        self.log_dict(
            {"columns": columns, "data": [[r.get(k) for k in columns] for r in rows]}, artifact_file
        )

    def log_html(self, page: str, artifact_file: str) -> None:
        """A self-contained HTML page as an artifact: MLflow's UI shows ``.html`` artifacts rendered (in a
        sandboxed frame), e.g. the trajectory viewer's ``trajectories/viewer.html``."""
        if self.run_id is not None and page:
            self.client.log_text(self.run_id, page, artifact_file)

    def log_curves_png(self, artifact_file: str = "plots/reward_accuracy.png") -> None:
        """Plot reward_mean per step and eval accuracy per version from the run's whole metric history
        (so a resumed run draws the full curve, not only the steps of its last process)."""
        if self.run_id is None:
            return
        if self.sink is not None:
            self.sink.flush()  # the history read below must hold every queued metric
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        for name, label in (("train/reward_mean", "train reward mean"), ("eval/accuracy", "eval accuracy")):
            points = [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, name)]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o" if name.startswith("eval") else None, label=label)
        ax.set_xlabel("policy version")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title(f"{self.cfg.experiment} / {self.cfg.trial}")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            path.write_bytes(buf.getvalue())
            self.client.log_artifact(self.run_id, str(path), str(Path(artifact_file).parent))

    def log_timeline(self, doc: dict[str, Any], artifact_dir: str = "timing") -> None:
        """The run's time accounting (``rollflow.timing``): ``timeline.json`` and its picture ``timeline.png``."""
        if self.run_id is None:
            return
        from rollflow.timing.plot import plot_timeline

        self.log_dict(doc, f"{artifact_dir}/timeline.json")
        with tempfile.TemporaryDirectory() as tmp:
            path = plot_timeline(doc, Path(tmp) / "timeline.png")
            self.client.log_artifact(self.run_id, str(path), artifact_dir)

    # -- dataset inputs ----------------------------------------------------------------------
    def log_dataset_inputs(self) -> None:
        """Log the train split and the evaluation set as the run's MLflow dataset inputs (MLflow's
        "Datasets used" column and the run page), contexts ``training`` and ``evaluation``.

        Each is named ``<experiment>-<train|eval>``, with the digest of its rows (``eval_set_digest``:
        sha256 of the rows as canonical JSON; MLflow's digest field holds its first 32 hex digits, the
        input's ``rollflow.digest`` tag the whole), its row count and where it came from. Nothing here may
        stop a run: a split that cannot be read is logged as a warning."""
        from rollflow.data import load_prompts
        from rollflow.evaluation import eval_prompts

        ds = self.cfg.dataset
        options = self.cfg.storage.options or None
        splits = {
            "training": lambda: load_prompts(ds, ds.train_split, storage_options=options),
            "evaluation": lambda: eval_prompts(self.cfg),
        }
        for context, rows_of in splits.items():
            try:
                self._log_dataset(rows_of(), context)
            except Exception as exc:  # tracking must never kill training
                log.warning("MLflow dataset input %s not logged (%s: %s)", context, type(exc).__name__, exc)

    def _log_dataset(self, rows: Sequence[dict[str, Any]], context: str) -> None:
        import json
        import warnings

        import mlflow.data
        import pandas as pd
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.entities import DatasetInput, InputTag

        from rollflow.eval_scores import eval_set_digest

        digest = eval_set_digest(rows)
        table = pd.DataFrame(
            [
                {k: v if isinstance(v, (str, int, float)) else json.dumps(v) for k, v in r.items()}
                for r in rows
            ]
        )
        from rollflow.data.loader import data_files_for

        ds = self.cfg.dataset
        split = ds.train_split if context == "training" else (self.cfg.eval.split or ds.eval_split)
        if ds.kind == "synthetic":  # (each source is computed only for its own kind: a files path is
            where = f"synthetic:{ds.synthetic.task}"  # no path of a generated task)
        elif ds.kind == "files":
            where = data_files_for(ds, split)
        else:
            where = ds.path
        name = f"{self.cfg.experiment}-{'train' if context == 'training' else 'eval'}"
        with warnings.catch_warnings():  # a path can be read as two registered source kinds: the same one
            warnings.simplefilter("ignore", UserWarning)
            try:
                dataset = mlflow.data.from_pandas(table, source=where, name=name, digest=digest[7:39])
            except Exception:  # not a path MLflow knows (a hub id, the synthetic task): name it only
                source = CodeDatasetSource(tags={"rollflow.dataset": where, "rollflow.split": split})
                dataset = mlflow.data.from_pandas(table, source=source, name=name, digest=digest[7:39])
        tags = [
            InputTag("mlflow.data.context", context),
            InputTag("rollflow.digest", digest),
            InputTag("rollflow.split", split),
        ]
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags=tags)])

    # -- model registry ----------------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        return Registry(self.client, self.model_name)

    @property
    def merged_model_name(self) -> str:
        """Where a LoRA run's merged model is registered (``tracking.register_merged``)."""
        return f"{self.model_name}-merged"

    def register_checkpoint(
        self,
        local_dir: str | Path,
        *,
        version: int,
        extra_tags: dict[str, Any] | None = None,
        base: BaseModelIdentity | None = None,
        merged_from: str | None = None,
        move_alias: bool = True,
    ) -> str:
        """Log a verified HF checkpoint dir as the run's chat model (a logged model named ``model``) and
        register it (moving the ``latest-rl`` alias unless ``move_alias`` is False); returns the registry
        version. The caller decides
        whether to. With ``base``, ``local_dir`` is a LoRA adapter of it (the logged model ``adapter``,
        tagged with the base's identity). With ``merged_from`` (``<name> v<n>``, the registered adapter),
        ``local_dir`` is that adapter merged into its base: it goes under ``merged_model_name``.
        Idempotent: a version this run already registered for ``version`` (a finalize that stopped after
        registering and is resumed) is returned again, with the alias on it, and nothing is logged twice."""
        registry = Registry(self.client, self.merged_model_name) if merged_from else self.registry
        if self.run_id is not None and (done := registry.registered_by(self.run_id, version)) is not None:
            if move_alias:
                registry.point_alias(done)
            return done
        tags = {"policy_version": str(version), "trial": self.cfg.trial, "experiment": self.cfg.experiment}
        tags.update({k: str(v) for k, v in (extra_tags or {}).items()})
        if base is not None:
            tags.update(base.tags())
        if merged_from is not None:
            tags["merged_from"] = merged_from
        lora_rank = self.cfg.train.lora.rank if base is not None else None
        card = PolicyCard(
            trial=self.cfg.trial,
            experiment=self.cfg.experiment,
            version=version,
            base_model=self.cfg.model.path,
            max_new_tokens=self.cfg.eval.max_new_tokens or self.cfg.rollout.generation.max_new_tokens,
            eval_accuracy=tags.get("eval_accuracy"),
            system_prompt=self.cfg.dataset.system_prompt,
            lora_rank=lora_rank,
            merged_from=merged_from,
            registered_name=registry.model_name,
        )
        model = log_chat_model(self.client, self.tracking_uri, self.run_id, local_dir, card, base=base)
        what = f"rollflow policy version {version} of trial {self.cfg.trial}"
        if base is not None:
            what = f"rank-{lora_rank} LoRA adapter (peft) of {base.name}: {what}"
        elif merged_from is not None:
            what = f"{what}: the LoRA adapter {merged_from} merged into its base"
        return registry.register(self.run_id, model, tags=tags, description=what, move_alias=move_alias)


def download_latest_registered(
    tracking_uri: str, model_name: str, dst: str | Path
) -> tuple[Path, dict[str, str]]:
    """Download the version under the ``latest-rl`` alias as one HF dir; returns (dir, version tags)."""
    from mlflow.tracking import MlflowClient

    local, inc = Registry(MlflowClient(tracking_uri=tracking_uri), model_name).download(dst, tracking_uri)
    return local, {**inc.tags, "registry_version": inc.version}
