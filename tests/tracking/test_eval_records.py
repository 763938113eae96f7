"""Evaluation records and what the registry gate compares (``rollflow.eval_scores``, ``rollflow.trial.evaluations``,
``rollflow.tracking.registry``), with numbers worked out by hand.

- a record is keyed by the version it scored; the 'before' record (v0) is never replaced;
- "correct" is ``eval.correct_reward``; partial-credit rewards are not binary, and the gate then compares
  the mean reward, so runs that all score 0 accuracy do not tie and register;
- the evaluation set is named by a digest of its rows; a candidate scored on another set is
  ``not-comparable``: registered as a version, the alias stays on the incumbent;
- the base split gives retention (accuracy on what the start solved) and learning (on what it did not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollflow.eval_scores import eval_set_digest, score_rewards
from rollflow.tracking.registry import Incumbent, decide_registration
from rollflow.trial.base_split import BaseSplit, read_base_split, write_base_split
from rollflow.trial.evaluations import eval_record, write_eval_record
from storage.fs import Storage

ROWS = [
    {"prompt_id": "p0", "messages": [{"role": "user", "content": "1+1="}], "answer": "2"},
    {"prompt_id": "p1", "messages": [{"role": "user", "content": "2+2="}], "answer": "4"},
]


def test_correct_reward_and_binary() -> None:
    # rewards 1, 0, 1, 0: accuracy 2/4 = 0.5, mean 0.5, binary
    assert score_rewards([1.0, 0.0, 1.0, 0.0]) == (0.5, 0.5, True)
    # partial credit 0.5, 0.25, 0, 0.5: nothing >= 1.0, accuracy 0; mean 1.25/4 = 0.3125; not binary
    assert score_rewards([0.5, 0.25, 0.0, 0.5]) == (0.0, 0.3125, False)
    # the same rewards with eval.correct_reward = 0.5: 0.5 counts as correct, 2/4 = 0.5; 0.25 still partial
    assert score_rewards([0.5, 0.25, 0.0, 0.5], correct_reward=0.5) == (0.5, 0.3125, False)
    assert score_rewards([0.5, 0.0], correct_reward=0.5) == (0.5, 0.25, True)


def test_eval_set_digest_depends_on_the_rows_only() -> None:
    d = eval_set_digest(ROWS)
    assert d == eval_set_digest([dict(reversed(list(r.items()))) for r in ROWS])  # key order: same set
    assert d.startswith("sha256:") and len(d) == 7 + 64
    assert d != eval_set_digest(ROWS[::-1])  # another order
    assert d != eval_set_digest([ROWS[0], {**ROWS[1], "answer": "5"}])  # another answer
    assert d != eval_set_digest(ROWS[:1])


def test_base_split_gives_retention_and_learning() -> None:
    before = [{"reward": 1.0}, {"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0}, {"reward": 0.0}]
    split = BaseSplit.from_rows(before, "sha256:x", 1.0)
    assert split.solved == (True, True, False, False, False)
    now = [{"reward": 1.0}, {"reward": 0.0}, {"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0}]
    # solved at the start: 1 of 2 still correct = 0.5; unsolved: 1 of 3 = 0.333...
    got = split.accuracies(now, "sha256:x")
    assert got == {"accuracy_base_solved": 0.5, "accuracy_base_unsolved": pytest.approx(1 / 3)}
    assert split.accuracies(now, "sha256:other") == {}  # another set: no retention figures
    assert BaseSplit.from_json(split.to_json()) == split
    all_unsolved = BaseSplit.from_rows([{"reward": 0.0}] * 2, "s", 1.0)
    assert all_unsolved.accuracies([{"reward": 1.0}, {"reward": 0.0}], "s") == {"accuracy_base_unsolved": 0.5}


def test_records_are_keyed_by_version_and_before_is_never_overwritten(tmp_path: Path) -> None:
    storage = Storage.open(str(tmp_path), "e", "t")
    assert write_eval_record(storage, {"version": 0, "accuracy": 0.2, "label": "before"})
    # a later evaluation that (wrongly or not) scores v0 again does not replace the 'before' score
    assert not write_eval_record(storage, {"version": 0, "accuracy": 1.0, "label": "v100"})
    assert eval_record(storage, 0) == {"version": 0, "accuracy": 0.2, "label": "before"}
    assert write_eval_record(storage, {"version": 100, "accuracy": 0.9, "label": "after"})
    assert write_eval_record(storage, {"version": 100, "accuracy": 0.91, "label": "v100"})  # a re-score
    assert eval_record(storage, 100) == {"version": 100, "accuracy": 0.91, "label": "v100"}
    assert sorted(storage.list("eval")) == ["eval/v000000.json", "eval/v000100.json"]


def test_the_base_split_is_decided_once(tmp_path: Path) -> None:
    storage = Storage.open(str(tmp_path), "e", "t")
    first = BaseSplit("sha256:a", (True, False), 1.0)
    assert write_base_split(storage, first) == first
    assert write_base_split(storage, BaseSplit("sha256:a", (False, False), 1.0)) == first
    assert read_base_split(storage) == first


@pytest.mark.parametrize("content", [b"{not json", b'{"eval_set": "sha256:a"}', b"[1, 2]"])
def test_a_corrupt_base_split_fails_loudly_and_is_never_rewritten(tmp_path: Path, content: bytes) -> None:
    from rollflow.api.errors import CorruptRecordError

    storage = Storage.open(str(tmp_path), "e", "t")
    storage.put_bytes("record/base-split.json", content)
    with pytest.raises(CorruptRecordError, match=r"record/base-split.json cannot be read .* left untouched"):
        read_base_split(storage)
    with pytest.raises(CorruptRecordError):
        write_base_split(storage, BaseSplit("sha256:a", (True, False), 1.0))
    assert storage.get_bytes("record/base-split.json") == content


def test_partial_credit_is_compared_by_mean_reward() -> None:
    # the incumbent and the candidate both score accuracy 0 under partial credit: no tie
    inc = Incumbent("1", 0.0, {}, mean_reward=0.40, binary=False, eval_set="sha256:s")
    worse = decide_registration(
        steps_trained=5, eval_accuracy=0.0, incumbent=inc, mean_reward=0.35, binary=False, eval_set="sha256:s"
    )
    assert (worse.register, worse.reason, worse.metric) == (False, "eval-worse", "mean_reward")
    assert "mean reward" in worse.detail and "0.3500 < incumbent v1 mean reward 0.4000" in worse.detail
    better = decide_registration(
        steps_trained=5, eval_accuracy=0.0, incumbent=inc, mean_reward=0.45, binary=False, eval_set="sha256:s"
    )
    assert (better.register, better.reason, better.move_alias) == (True, "eval-improved", True)
    # binary on both sides: accuracy, as before
    binary = Incumbent("1", 0.5, {}, mean_reward=0.5, binary=True, eval_set="sha256:s")
    d = decide_registration(
        steps_trained=5,
        eval_accuracy=0.5,
        incumbent=binary,
        mean_reward=0.5,
        binary=True,
        eval_set="sha256:s",
    )
    assert (d.reason, d.metric) == ("eval-tied", "accuracy")


def test_another_evaluation_set_is_not_comparable() -> None:
    inc = Incumbent("1", 0.20, {}, mean_reward=0.2, binary=True, eval_set="sha256:users-rows")
    d = decide_registration(
        steps_trained=30, eval_accuracy=0.89, incumbent=inc, mean_reward=0.89, eval_set="sha256:demo"
    )
    assert (d.register, d.reason, d.move_alias) == (True, "not-comparable", False)
    assert "not comparable" in d.detail and "alias stays on the incumbent" in d.detail
    # an incumbent registered without a digest cannot vouch for its set either
    legacy = Incumbent("1", 0.20, {})
    assert decide_registration(
        steps_trained=1, eval_accuracy=0.9, incumbent=legacy, eval_set="sha256:d"
    ).reason == ("not-comparable")
    # a retrain re-scores its incumbent on its own set: comparable by construction
    rescored = inc.rescore(0.5, mean_reward=0.5, binary=True)
    d = decide_registration(
        steps_trained=2, eval_accuracy=0.6, incumbent=rescored, mean_reward=0.6, eval_set="sha256:demo"
    )
    assert (d.reason, d.move_alias) == ("eval-improved", True)
