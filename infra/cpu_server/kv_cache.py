"""A slot KV cache that lets sequences of different lengths decode together through a stock HF model.

What it is: per layer, one key and one value buffer ``[max_batch, n_kv_heads, capacity, head_dim]``; row
``r`` holds the sequence in slot ``r``. Before each forward over rows ``[lo, hi)`` the engine calls
``bind`` with each row's write positions; the model's attention layers then call ``update(k, v, layer)``
(the one method transformers' attention uses), which scatters the new keys/values into those positions
and returns the view ``[lo:hi, :, :kv_len]`` for attention. The engine passes its own 4D mask and
``position_ids``, so rows never see each other's or their own stale entries.

What it is not: a paged allocator or a prefix cache. Slots are compacted by the engine (``move_row``) so
the running rows are always the contiguous range ``[0, n)`` and every forward uses a view, never a copy.
Buffers are allocated lazily from the first ``update`` (shape and dtype come from the model), and grow
by doubling up to ``max_len``.
"""

from __future__ import annotations

from typing import Any

import torch


class SlotKVCache:
    """Duck-typed stand-in for ``transformers.Cache`` with per-row write positions."""

    is_compileable = False

    def __init__(self, max_batch: int, max_len: int, initial_capacity: int = 256) -> None:
        self.max_batch = max_batch
        self.max_len = max_len
        self.capacity = min(initial_capacity, max_len)
        self.keys: list[torch.Tensor] = []  # per layer: [max_batch, H_kv, capacity, D]
        self.values: list[torch.Tensor] = []
        self._lo = 0
        self._hi = 0
        self._write_idx: torch.Tensor | None = None  # [B, Q] cache position each query token writes to
        self._kv_len = 0

    # --- engine side -------------------------------------------------------------------------------------------

    def bind(self, lo: int, hi: int, write_idx: torch.Tensor, kv_len: int) -> None:
        """Set up the next forward: rows ``[lo, hi)`` write query token j of row i at ``write_idx[i, j]``.

        write_idx: ``[hi - lo, Q]`` int64; attention will read positions ``[0, kv_len)``.
        """
        needed = max(kv_len, int(write_idx.max()) + 1)
        if needed > self.capacity:
            self._grow(needed)
        self._lo, self._hi, self._write_idx, self._kv_len = lo, hi, write_idx, kv_len

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (compaction)."""
        for buf in (*self.keys, *self.values):
            buf[dst, :, :length].copy_(buf[src, :, :length])

    def reset(self, capacity: int | None = None) -> None:
        """Drop all buffers (flush_cache); the next forward allocates them again."""
        self.keys, self.values = [], []
        self.capacity = min(capacity or 256, self.max_len)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.keys, *self.values))

    def _grow(self, needed: int) -> None:
        new_cap = self.capacity
        while new_cap < needed:
            new_cap *= 2
        new_cap = max(needed, min(new_cap, self.max_len))
        for bufs in (self.keys, self.values):
            for i, old in enumerate(bufs):
                n, h, _, d = old.shape
                new = old.new_zeros(n, h, new_cap, d)
                new[:, :, : self.capacity].copy_(old)
                bufs[i] = new
        self.capacity = new_cap

    # --- model side (transformers' attention calls these) ------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states/value_states: ``[B, H_kv, Q, D]``; returns the ``[B, H_kv, kv_len, D]`` views."""
        assert self._write_idx is not None, "bind() must be called before a forward"
        while len(self.keys) <= layer_idx:
            _, h, _, d = key_states.shape
            self.keys.append(key_states.new_zeros(self.max_batch, h, self.capacity, d))
            self.values.append(value_states.new_zeros(self.max_batch, h, self.capacity, d))
        B, H, Q, D = key_states.shape
        idx = self._write_idx.view(B, 1, Q, 1).expand(B, H, Q, D)
        k = self.keys[layer_idx][self._lo : self._hi]
        v = self.values[layer_idx][self._lo : self._hi]
        k.scatter_(2, idx, key_states.to(k.dtype))
        v.scatter_(2, idx, value_states.to(v.dtype))
        return k[:, :, : self._kv_len], v[:, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def __len__(self) -> int:
        return len(self.keys)
