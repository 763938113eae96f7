"""Trajectory groups -> one right-padded training batch, and row selection for micro-batches.

What it is: ``TrainBatch`` (padded [B, T] tensors + per-group metadata) built by ``build_batch`` from
``storage.schema.TrajectoryGroup`` objects, ``TrainBatch.select`` (rows of some groups, trimmed to their
longest sequence: each micro-batch is padded only as far as it needs), and a no-pickle byte encoding
(safetensors) so rank 0 can broadcast the batch to the other ranks.
What it is not: storage access, micro-batch planning (``microbatch.py``) or any model code.

Alignment: token t of a row carries ``behav_logp[t] = log pi_behav(x_t | x_<t)``, so the model's logits
at position t - 1 score it (``logprobs.py`` shifts). Position 0 has no prediction; its loss mask is forced
to 0. Padding is on the right with ``pad_id``; pads have attention 0 and loss mask 0, and with causal
attention they never influence a real token, so padding changes no logprob.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rollflow.api.errors import TrainerError

logger = logging.getLogger(__name__)

_TENSOR_FIELDS = (
    "input_ids", "attention_mask", "loss_mask", "behav_logp", "versions", "rewards", "group_index",
)  # fmt: skip
_OPTIONAL_FIELDS = ("prox_logp", "ref_logp", "advantages")


@dataclass(frozen=True)
class GroupInfo:
    """Where one trajectory group sits in the batch."""

    group_id: str
    head_version: int
    rows: tuple[int, ...]  # row indices into the batch tensors
    n_tokens: int  # real (unpadded) tokens over its rows


@dataclass
class TrainBatch:
    """Right-padded tensors of B sequences (all groups of one step, or a micro-batch of them)."""

    input_ids: torch.Tensor  # [B, T] int64, pad_id after each sequence
    attention_mask: torch.Tensor  # [B, T] bool
    loss_mask: torch.Tensor  # [B, T] float32, 1 on policy tokens (never position 0 or pads)
    behav_logp: torch.Tensor  # [B, T] float32 behaviour logprob of token t (0 where loss_mask = 0)
    versions: torch.Tensor  # [B, T] int64 policy version that sampled token t (-1 where loss_mask = 0)
    rewards: torch.Tensor  # [B] float32 raw rewards
    group_index: torch.Tensor  # [B] int64, index into ``groups`` (0..G-1 within this batch)
    groups: list[GroupInfo] = field(default_factory=list)
    prox_logp: torch.Tensor | None = None  # [B, T] recomputed proximal logprob (decoupled loss)
    ref_logp: torch.Tensor | None = None  # [B, T] reference-model logprob (KL penalty)
    advantages: torch.Tensor | None = None  # [B] per-sequence advantage

    @property
    def n_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        """Real tokens (attention 1) in the batch."""
        return int(self.attention_mask.sum().item())

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def rows_of(self, group_indices: Sequence[int]) -> list[int]:
        return [r for g in group_indices for r in self.groups[g].rows]

    def select(self, rows: Sequence[int]) -> TrainBatch:
        """The given rows, trimmed to their longest sequence; group metadata is dropped (rows only)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        if idx.numel() == 0:
            raise ValueError("select() needs at least one row")
        am = self.attention_mask.index_select(0, idx)
        t = max(1, int(am.sum(-1).max().item()))

        def take(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            x = x.index_select(0, idx)
            return x[:, :t] if x.dim() == 2 else x

        return TrainBatch(
            input_ids=take(self.input_ids),  # type: ignore[arg-type]
            attention_mask=am[:, :t],
            loss_mask=take(self.loss_mask),  # type: ignore[arg-type]
            behav_logp=take(self.behav_logp),  # type: ignore[arg-type]
            versions=take(self.versions),  # type: ignore[arg-type]
            rewards=take(self.rewards),  # type: ignore[arg-type]
            group_index=take(self.group_index),  # type: ignore[arg-type]
            groups=[],
            prox_logp=take(self.prox_logp),
            ref_logp=take(self.ref_logp),
            advantages=take(self.advantages),
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            name: (getattr(self, name).to(device) if getattr(self, name) is not None else None)
            for name in _TENSOR_FIELDS + _OPTIONAL_FIELDS
        }
        return replace(self, **moved)

    # --- no-pickle wire format (rank 0 -> other ranks) ----------------------------------------------------

    def to_bytes(self) -> bytes:
        tensors = {name: getattr(self, name).contiguous() for name in _TENSOR_FIELDS}
        groups = [[g.group_id, g.head_version, list(g.rows), g.n_tokens] for g in self.groups]
        return st_save(tensors, metadata={"groups": json.dumps(groups)})

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainBatch:
        tensors = st_load(data)
        meta = _safetensors_metadata(data)
        groups = [GroupInfo(g[0], int(g[1]), tuple(g[2]), int(g[3])) for g in json.loads(meta["groups"])]
        return cls(**{name: tensors[name] for name in _TENSOR_FIELDS}, groups=groups)


def _safetensors_metadata(data: bytes) -> dict[str, Any]:
    """The ``__metadata__`` of a safetensors blob (an 8-byte little-endian header size, then JSON)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return dict(header.get("__metadata__", {}))


def build_batch(groups: Sequence[Any], *, pad_id: int = 0) -> TrainBatch:
    """Pad the rows of ``groups`` (``TrajectoryGroup``-like: .group_id, .head_version, .rows) into a batch.

    Rows keep their order; groups keep theirs. Raises TrainerError on a malformed row (mismatched lengths).
    """
    rows: list[Any] = []
    infos: list[GroupInfo] = []
    for g in groups:
        start = len(rows)
        rows.extend(g.rows)
        n_tok = sum(len(r.input_ids) for r in g.rows)
        infos.append(GroupInfo(str(g.group_id), int(g.head_version), tuple(range(start, len(rows))), n_tok))
    if not rows:
        raise TrainerError("build_batch got no rows")
    lens = [len(r.input_ids) for r in rows]
    b, t = len(rows), max(lens)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((b, t), dtype=torch.bool)  # [B, T]
    loss_mask = torch.zeros((b, t), dtype=torch.float32)  # [B, T]
    behav = torch.zeros((b, t), dtype=torch.float32)  # [B, T]
    versions = torch.full((b, t), -1, dtype=torch.long)  # [B, T]
    forced = 0
    for i, r in enumerate(rows):
        n = lens[i]
        if not (len(r.loss_mask) == len(r.logprobs) == len(r.versions) == n):
            raise TrainerError(
                f"trajectory {r.traj_id!r}: input_ids/loss_mask/logprobs/versions lengths "
                f"differ ({n}, {len(r.loss_mask)}, {len(r.logprobs)}, {len(r.versions)})"
            )
        if n == 0:
            continue
        input_ids[i, :n] = torch.as_tensor(r.input_ids, dtype=torch.long)
        attention[i, :n] = True
        m = torch.as_tensor(r.loss_mask, dtype=torch.float32)
        if m[0] != 0:
            forced += 1
            m[0] = 0.0
        loss_mask[i, :n] = m
        behav[i, :n] = torch.as_tensor(r.logprobs, dtype=torch.float32) * m
        versions[i, :n] = torch.where(m > 0, torch.as_tensor(r.versions, dtype=torch.long), -1)
    if forced:
        logger.warning(
            "%d row(s) had loss_mask[0] = 1; the first token has no prediction, masked out", forced
        )
    rewards = torch.tensor([float(r.reward) for r in rows], dtype=torch.float32)  # [B]
    group_index = torch.tensor([gi for gi, g in enumerate(infos) for _ in g.rows], dtype=torch.long)  # [B]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behav_logp=behav,
        versions=versions,
        rewards=rewards,
        group_index=group_index,
        groups=infos,
    )


def signal_groups(batch: TrainBatch) -> set[int]:
    """Indices of the groups with a non-zero advantage on some row (the rest teach nothing)."""
    assert batch.advantages is not None
    active = batch.group_index[batch.advantages != 0].tolist()  # [n_active_rows] -> group ids
    return set(active)
