"""Replay: rerun a trial's trainer from its own record, with no generation, and compare with what it published.

Run it::

    rollflow replay TRIAL --to N [--config C] [--from-resume-point] [--work-dir runs/replay]

What it is: ``replay(cfg, trial_storage, to_version=N, work_dir=...)``. The record a trial keeps is enough
to train it again:

- ``trainer/consumed/step-{k:08d}.json``: the group ids step k trained on, in batch order;
- the committed shards: those groups, byte for byte (each shard's sha256 is checked against its record
  before use, as the trainer's reader does);
- the trial's config record (``record/config.json``, ``rollflow.trial.record``; the caller resolves it),
  and optionally a resume point (weights, optimizer, scheduler, RNG) to start from instead of v0.

The real ``Trainer`` runs in a scratch trial under ``work_dir`` with one change: its data source is
``RecordedBatches``, which hands it, step after step, exactly the groups the consumed logs name (the
``ShardSource`` contract, so nothing else in the trainer changes), and it publishes every version.
After step N it stops. Then every version present in both the trial and the replay is compared tensor
by tensor, bit for bit (``compare_checkpoints``): the report names the first version that differs, the
tensors that differ there and by how much (max |a - b|, elements that differ). On CPU, one process,
the same torch threads and the same config, a replay of an uninterrupted or resumed run is expected to
match exactly; a run trained with several ranks (DDP/FSDP: a different reduction order) or on a GPU
(non-deterministic kernels) is not, and the report says where it departs.

What it is not: a second trainer (it is the real one), or generation (no server starts). It does not
write to the replayed trial.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import TrainerError
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.errors import CorruptShardError
from storage.fs import Storage
from storage.schema import TrajectoryGroup
from storage.shard_reader import ReaderCursor, ShardReader, TakeResult

logger = logging.getLogger(__name__)


class ReplayError(TrainerError):
    """The trial's record cannot drive a replay (a consumed log or a group is missing, vN not committed)."""


def consumed_batches(storage: Storage, first: int, last: int) -> list[list[str]]:
    """The group ids of steps ``first..last`` from the consumed logs, in batch order."""
    out = []
    for step in range(first, last + 1):
        try:
            doc = storage.get_json(keys.consumed_key(step))
        except FileNotFoundError:
            raise ReplayError(
                f"the record is incomplete: {keys.consumed_key(step)} (the groups step {step} trained on) is missing"
            ) from None
        groups = doc.get("groups") if isinstance(doc, dict) else None
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ReplayError(f"{keys.consumed_key(step)} holds no list of group ids")
        out.append(groups)
    return out


def load_groups(storage: Storage, wanted: set[str]) -> dict[str, TrajectoryGroup]:
    """The committed groups with these ids, read from verified shards (size, sha256, schema)."""
    reader = ShardReader(storage)
    found: dict[str, TrajectoryGroup] = {}
    for rec in reader.list_commits(include_consumed=True):
        if len(found) == len(wanted):
            break
        try:
            groups = reader._load(rec)  # the reader's own verification, without consuming anything
        except CorruptShardError as e:
            logger.warning("replay skips commit %s: %s", rec.commit_id, e)
            continue
        for g in groups:
            if g.group_id in wanted:
                found[g.group_id] = g
    missing = sorted(wanted - set(found))
    if missing:
        raise ReplayError(
            f"{len(missing)} trained group(s) are in no readable committed shard (first: {missing[0]}): "
            "the record cannot reproduce the run"
        )
    return found


class RecordedBatches:
    """A ``ShardSource`` that hands out the recorded batches, one per ``take``, then nothing."""

    def __init__(self, batches: Sequence[list[TrajectoryGroup]]) -> None:
        self._batches = list(batches)
        self._next = 0
        self.cursor = ReaderCursor()  # the trainer saves and restores it; the replay has no use for it

    def take(self, n_groups: int, *, min_head_version: int | None = None) -> TakeResult:
        if self._next >= len(self._batches):
            return TakeResult(groups=[])
        batch = self._batches[self._next]
        if len(batch) != n_groups:
            raise ReplayError(
                f"recorded step {self._next + 1} trained {len(batch)} groups but train.batch_size is {n_groups}"
            )
        self._next += 1
        return TakeResult(groups=list(batch))


@dataclass
class TensorDiff:
    name: str
    max_abs_diff: float
    differing: int  # elements whose bits differ
    numel: int


@dataclass
class VersionDiff:
    version: int
    tensors: int
    identical: bool
    diffs: list[TensorDiff] = field(default_factory=list)


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def compare_checkpoints(a_dir: Path, b_dir: Path, version: int) -> VersionDiff:
    """Every tensor of two checkpoint directories, bit for bit (a tensor only one side has counts as differing)."""
    a, b = _load_dir(a_dir), _load_dir(b_dir)
    diffs = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            diffs.append(TensorDiff(name, float("inf"), -1, -1))
            continue
        xb = x.contiguous().view(torch.uint8).view(x.numel(), -1)
        yb = y.contiguous().view(torch.uint8).view(y.numel(), -1)
        differ = (xb != yb).any(dim=1)
        n = int(differ.sum())
        if n:
            gap = (x.double() - y.double()).abs().max().item() if x.is_floating_point() else float("nan")
            diffs.append(TensorDiff(name, gap, n, x.numel()))
    diffs.sort(key=lambda d: -d.max_abs_diff)
    return VersionDiff(version, len(set(a) | set(b)), not diffs, diffs)


@dataclass
class ReplayReport:
    to_version: int
    start_version: int
    steps: int
    identical: bool
    versions: list[VersionDiff]
    first_divergent: int | None
    wall_s: float
    work_dir: str

    def summary(self) -> str:
        compared = [v.version for v in self.versions]
        span = f"v{compared[0]}..v{compared[-1]}" if compared else "none"
        head = (
            f"replayed {self.steps} steps (v{self.start_version} -> v{self.to_version}) in {self.wall_s:.1f} s; "
            f"compared {len(compared)} versions ({span}) with the trial's checkpoints"
        )
        if self.identical:
            return (
                head
                + f": bit for bit identical, every tensor of every version (v{self.to_version}: {self.versions[-1].tensors} tensors)"
            )
        v = next(x for x in self.versions if x.version == self.first_divergent)
        lines = [
            head + f": DIFFERENT from v{v.version} on ({len(v.diffs)} of {v.tensors} tensors differ there)"
        ]
        for d in v.diffs[:8]:
            lines.append(f"  {d.name}: max |diff| {d.max_abs_diff:.3g}, {d.differing} of {d.numel} elements")
        last = self.versions[-1]
        worst = max((d.max_abs_diff for d in last.diffs), default=0.0)
        lines.append(f"  at v{last.version}: {len(last.diffs)} tensors differ, max |diff| {worst:.3g}")
        return "\n".join(lines)


def _copy_resume_point(src: Storage, dst: Storage, step: int) -> None:
    prefix = keys.trainer_state_dir(step)
    for k in src.list(prefix):
        dst.put_bytes(k, src.get_bytes(k))
    dst.put_bytes(keys.trainer_state_key(step), src.get_bytes(keys.trainer_state_key(step)))


class _StopAt:
    """Trainer hooks: set the stop event once ``version`` reaches the target (the trainer then stops
    before taking another batch)."""

    def __init__(self, target: int, stop: threading.Event) -> None:
        self.target, self.stop = target, stop

    def before_step(self, version: int) -> None:
        pass

    def after_step(self, version: int) -> None:
        if version >= self.target:
            self.stop.set()


def replay(
    cfg: ExperimentConfig,
    trial_storage: Storage,
    *,
    to_version: int,
    work_dir: str | Path,
    from_resume_point: bool = False,
    keep: bool = False,
) -> ReplayReport:
    """Rerun the trainer of ``trial_storage``'s trial to ``to_version`` from its record and compare (module
    docstring). ``cfg`` is the trial's config (its record). The scratch trial is removed unless ``keep``."""
    from rollflow.training.resume import list_resume_steps
    from rollflow.training.trainer import Trainer

    t0 = time.perf_counter()
    store = CheckpointStore(trial_storage)
    committed = store.list_committed()
    if to_version not in committed:
        there = f"v{committed[0]}..v{committed[-1]}" if committed else "none"
        raise ReplayError(f"checkpoint v{to_version} is not committed in the trial (committed: {there})")
    start = 0
    if from_resume_point:
        steps = [s for s in list_resume_steps(trial_storage) if s < to_version]
        start = steps[-1] if steps else 0
    ids = consumed_batches(trial_storage, start + 1, to_version)
    sizes = {len(batch) for batch in ids}
    if sizes != {cfg.train.batch_size}:
        raise ReplayError(
            f"the consumed logs hold batches of {sorted(sizes)} groups but train.batch_size is "
            f"{cfg.train.batch_size}: replay with the trial's own config (its record/config.json)"
        )
    groups = load_groups(trial_storage, {g for batch in ids for g in batch})
    work = Path(work_dir).resolve()
    scratch_name = f"replay-{cfg.trial}-v{to_version}-{uuid.uuid4().hex[:8]}"
    scratch = Storage.open(str(work), cfg.experiment, scratch_name)
    if start:
        _copy_resume_point(trial_storage, scratch, start)
    rcfg = dataclasses.replace(
        cfg,
        trial=scratch_name,
        storage=dataclasses.replace(cfg.storage, root=str(work), options={}, keep_checkpoints=to_version + 2),
        train=dataclasses.replace(
            cfg.train,
            checkpoint_every=1,
            resume_every=max(cfg.train.steps, to_version) + 1,
            distributed="none",
        ),
    )
    stop = threading.Event()
    source = RecordedBatches([[groups[g] for g in batch] for batch in ids])

    class RecordTrainer(Trainer):
        """The real trainer, reading the recorded batches instead of the shards' FIFO."""

        def _setup(self) -> None:
            super()._setup()
            self.reader = source  # type: ignore[assignment]
            if self.collector is not None:
                self.collector.reader = source

    summary = RecordTrainer(rcfg, scratch, stop_event=stop, hooks=_StopAt(to_version, stop)).run()
    if summary.final_version != to_version:
        raise ReplayError(f"the replay stopped at v{summary.final_version}, not v{to_version}")
    mine = CheckpointStore(scratch)
    cache = work / "cache" / scratch_name
    versions = []
    for v in sorted(set(committed) & set(mine.list_committed())):
        if v <= start:
            continue
        versions.append(
            compare_checkpoints(
                store.verified_dir(v, cache / "trial"), mine.verified_dir(v, cache / "replay"), v
            )
        )
    first = next((v.version for v in versions if not v.identical), None)
    report = ReplayReport(
        to_version=to_version,
        start_version=start,
        steps=to_version - start,
        identical=first is None and bool(versions),
        versions=versions,
        first_divergent=first,
        wall_s=time.perf_counter() - t0,
        work_dir=str(work / cfg.experiment / scratch_name),
    )
    if not keep:
        shutil.rmtree(work / cfg.experiment / scratch_name, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return report


def replay_summary(report: ReplayReport) -> dict[str, Any]:
    """The report as JSON-ready values."""
    return dataclasses.asdict(report)
