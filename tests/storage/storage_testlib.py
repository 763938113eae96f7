"""Tiny synthetic trajectory data for the storage tests (helpers, not tests)."""

from __future__ import annotations

import random

from storage.schema import TrajectoryGroup, TrajectoryRow


def make_group(
    gid: str, *, head: int = 0, n_rows: int = 2, prompt_len: int = 3, gen_len: int = 4, seed: int = 0
) -> TrajectoryGroup:
    """A group whose rows have `prompt_len` prompt tokens (version -1) and `gen_len` generated tokens.

    Generated tokens alternate versions head, head+1, ... so row head = `head`, tail = head+1 (gen_len>1).
    """
    rng = random.Random(f"{gid}-{seed}")
    rows = []
    for r in range(n_rows):
        gen_versions = [head + (t % 2) for t in range(gen_len)]
        rows.append(
            TrajectoryRow.build(
                traj_id=f"{gid}-r{r}",
                group_id=gid,
                prompt_id=f"p-{gid}",
                input_ids=[rng.randrange(1000) for _ in range(prompt_len + gen_len)],
                loss_mask=[0] * prompt_len + [1] * gen_len,
                logprobs=[0.0] * prompt_len + [-rng.random() for _ in range(gen_len)],
                versions=[-1] * prompt_len + gen_versions,
                reward=float(r),
                finish_reason="stop",
                created_at=1000.0 + r,
                extra={"r": r},
            )
        )
    return TrajectoryGroup(gid, f"p-{gid}", rows)


def traj_ids(groups: list[TrajectoryGroup]) -> list[str]:
    return [r.traj_id for g in groups for r in g.rows]
