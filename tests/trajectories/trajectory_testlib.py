"""Small hand-made trials for the trajectory-store tests (helpers, not tests): rows whose numbers the
tests check by hand, written through the real ShardWriter, plus consumed logs as the trainer writes them."""

from __future__ import annotations

from storage import keys
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter


class CharDecoder:
    """Token id = Unicode code point: decoding is ``chr`` per id (a byte-level tokenizer in miniature)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def group(
    gid: str,
    prompt: str,
    answers: list[tuple[str, float]],
    *,
    version: int,
    prompt_id: str | None = None,
    finish: str = "stop",
    created_at: float = 1000.0,
) -> TrajectoryGroup:
    """One group: the prompt's tokens (version -1), then each answer's tokens made by ``version``."""
    pid = prompt_id or f"p-{gid}"
    rows = []
    for r, (answer, reward) in enumerate(answers):
        p, a = ids(prompt), ids(answer)
        rows.append(
            TrajectoryRow.build(
                traj_id=f"{gid}-{r}",
                group_id=gid,
                prompt_id=pid,
                input_ids=p + a,
                loss_mask=[0] * len(p) + [1] * len(a),
                logprobs=[0.0] * len(p) + [-0.5] * len(a),
                versions=[-1] * len(p) + [version] * len(a),
                reward=reward,
                finish_reason=finish,
                created_at=created_at + r,
            )
        )
    return TrajectoryGroup(gid, pid, rows)


def write(storage: Storage, groups: list[TrajectoryGroup], *, flush_rows: int = 4) -> None:
    with ShardWriter(storage, "t", flush_rows=flush_rows, flush_seconds=3600.0) as w:
        for g in groups:
            w.add(g)


def consumed(storage: Storage, step: int, group_ids: list[str]) -> None:
    """The trainer's audit log of step ``step`` (the version that step published)."""
    storage.put_json(
        keys.consumed_key(step), {"step": step, "groups": group_ids, "head_versions": [], "dropped_stale": 0}
    )


def small_trial(storage: Storage) -> None:
    """Three groups (hand-checked numbers in test_query.py):

    g0 (v0, prompt p-same "1+1=", answers "2" / "11", rewards 0 / 1), g1 (v0, "2+2=", "4" / "4444", 1 / 1),
    g2 (v1, prompt p-same again, answers "3" / "<script>alert(1)</script>", rewards 0 / 0, both cut at
    'length'); the step that published v3 trained g0 and g1.
    """
    write(
        storage,
        [
            group("g0", "1+1=", [("2", 0.0), ("11", 1.0)], version=0, prompt_id="p-same"),
            group("g1", "2+2=", [("4", 1.0), ("4444", 1.0)], version=0),
            group(
                "g2",
                "1+1=",
                [("3", 0.0), ("<script>alert(1)</script>", 0.0)],
                version=1,
                prompt_id="p-same",
                finish="length",
                created_at=2000.0,
            ),
        ],
    )
    consumed(storage, 3, ["g0", "g1"])
