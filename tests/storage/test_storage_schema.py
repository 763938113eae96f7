"""Trajectory schema: head/tail computation, validation naming the field, table round trip (pure, no I/O)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from storage_testlib import make_group

from storage.errors import InvalidTrajectoryError, SchemaMismatchError
from storage.schema import (
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    TrajectoryGroup,
    TrajectoryRow,
    groups_to_table,
    table_to_groups,
    validate_table,
)


def _row(**kw) -> TrajectoryRow:
    base = dict(
        traj_id="t0",
        group_id="g",
        prompt_id="p",
        input_ids=[5, 6, 7, 8, 9],
        loss_mask=[0, 0, 1, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -0.25, -1.0],
        versions=[-1, -1, 3, 3, 4],
        reward=1.0,
        finish_reason="stop",
    )
    base.update(kw)
    return TrajectoryRow.build(**base)


def test_build_computes_head_tail_by_hand() -> None:
    # versions over loss tokens: [3, 3, 4] -> head 3, tail 4
    r = _row()
    assert (r.head_version, r.tail_version) == (3, 4)
    # no loss token at all -> (-1, -1)
    r2 = _row(loss_mask=[0] * 5)
    assert (r2.head_version, r2.tail_version) == (-1, -1)
    # prompt tokens with a version are ignored when masked out: [9, 2, 2] masked -> only [2, 2]
    r3 = _row(versions=[9, 9, 2, 2, 2])
    assert (r3.head_version, r3.tail_version) == (2, 2)


def test_group_head_ignores_rows_without_policy_tokens() -> None:
    g = TrajectoryGroup(
        "g", "p", [_row(), _row(traj_id="t1", versions=[-1, -1, 5, 6, 7]), _row(loss_mask=[0] * 5)]
    )
    # row heads 3, 5, -1 -> group head = min over >= 0 = 3; tails 4, 7, -1 -> 7
    assert (g.head_version, g.tail_version) == (3, 7)
    assert g.n_tokens == 15 and g.rewards == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(loss_mask=[0, 0, 1, 1]), "len\\(loss_mask\\)=4"),
        (dict(logprobs=[0.0]), "len\\(logprobs\\)=1"),
        (dict(loss_mask=[0, 0, 2, 1, 1]), "loss_mask values"),
        (dict(extra="{not json"), "extra is not valid JSON"),
        (dict(n_turns=0), "n_turns"),
    ],
)
def test_row_validation_names_the_problem(kw: dict, match: str) -> None:
    with pytest.raises(InvalidTrajectoryError, match=match):
        _row(**kw)


def test_round_trip_keeps_order_and_values() -> None:
    groups = [make_group("b", head=2), make_group("a", head=0, n_rows=3)]
    table = groups_to_table(groups, writer="w")
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)
    assert table.schema.metadata[b"rollflow.schema_version"] == str(SCHEMA_VERSION).encode()
    back = table_to_groups(table)
    assert [g.group_id for g in back] == ["b", "a"]
    for g0, g1 in zip(groups, back, strict=True):
        for r0, r1 in zip(g0.rows, g1.rows, strict=True):
            assert (
                r1.input_ids == r0.input_ids and r1.versions == r0.versions and r1.loss_mask == r0.loss_mask
            )
            # float32 storage: compare at float32 precision
            assert np.array_equal(np.float32(r1.logprobs), np.float32(r0.logprobs))
            assert (r1.head_version, r1.tail_version, r1.extra) == (
                r0.head_version,
                r0.tail_version,
                r0.extra,
            )
            assert r1.writer == "w"


def test_table_of_sliced_table_round_trips() -> None:
    table = groups_to_table([make_group(f"g{i}", head=i) for i in range(4)])
    back = table_to_groups(table.slice(2, 4))
    # rows 2..5 of [g0-r0, g0-r1, g1-r0, g1-r1, g2-r0, g2-r1, ...] -> groups g1, g2
    assert [g.group_id for g in back] == ["g1", "g2"]
    assert back[0].rows[0].traj_id == "g1-r0"
    assert back[0].rows[0].input_ids == table.column("input_ids")[2].as_py()


def _good_table() -> pa.Table:
    return groups_to_table([make_group("g", head=1)])


def test_validate_table_names_the_field() -> None:
    t = _good_table()
    validate_table(t)
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(t.drop_columns(["reward"]))
    assert e.value.field == "reward" and "missing" in str(e.value)
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(
            t.set_column(t.schema.get_field_index("reward"), "reward", t.column("reward").cast(pa.float64()))
        )
    assert e.value.field == "reward"
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(t.append_column("surprise", pa.array([1] * t.num_rows)))
    assert e.value.field == "surprise"
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(t.replace_schema_metadata({b"rollflow.schema_version": b"2"}))
    assert e.value.field == "schema_version"
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(t.replace_schema_metadata({}))
    assert e.value.field == "schema_version"


def test_validate_table_checks_row_invariants() -> None:
    t = _good_table()
    i = t.schema.get_field_index("head_version")
    wrong = t.set_column(i, TRAJECTORY_SCHEMA.field("head_version"), pa.array([7] * t.num_rows, pa.int32()))
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(wrong)
    assert e.value.field == "head_version" and "stored 7 != 1" in str(e.value)
    validate_table(wrong, deep=False)  # schema-only check passes
    j = t.schema.get_field_index("logprobs")
    short = t.set_column(
        j, TRAJECTORY_SCHEMA.field("logprobs"), pa.array([[0.0]] * t.num_rows, pa.list_(pa.float32()))
    )
    with pytest.raises(SchemaMismatchError) as e:
        validate_table(short)
    assert e.value.field == "logprobs"


def test_groups_to_table_rejects_inconsistent_group() -> None:
    g = make_group("g")
    g.rows[1].group_id = "other"
    with pytest.raises(InvalidTrajectoryError, match="sits in group"):
        groups_to_table([g])
    with pytest.raises(InvalidTrajectoryError, match="no rows"):
        groups_to_table([TrajectoryGroup("e", "p", [])])
    bad = make_group("h")
    bad.rows[0].head_version = 99  # not built by .build -> caught vectorised on write
    with pytest.raises(SchemaMismatchError) as e:
        groups_to_table([bad])
    assert e.value.field == "head_version"
