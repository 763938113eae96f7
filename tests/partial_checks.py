"""Test helper: check that a committed trajectory row continues a partial sample kept at a graceful stop.

What it is: ``cut_samples(storage)``, the samples a stop cut in the middle (``rollout/partials/``), and
``continued_row(rows, sample)``, which finds the one committed row that starts with the sample's prompt
and pre-stop tokens and asserts it carries them exactly: the same logprobs, ``-1`` over the prompt, the
recorded per-token versions over the pre-stop tokens, and versions no older than those after them.
Shared by the loop-level test (``tests/rollout/test_partials.py``) and the Prefect-level one
(``tests/recovery/test_cancel_resume.py``). What it is not: the capture or the continuation
(``rollflow.rollout.partials``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollflow.rollout.partials import PartialSample
from storage.fs import Storage
from storage.partial_records import load_partials


def cut_samples(storage: Storage) -> list[PartialSample]:
    """The samples of the trial's partial records that the stop cut (``finish_reason`` abort) after
    they had generated at least one token."""
    records, _ = load_partials(storage)
    samples = (PartialSample.from_dict(s) for ep in records.values() for s in ep["samples"])
    return [s for s in samples if not s.finished and s.output_ids]


def continued_row(rows: Sequence[Any], sample: PartialSample) -> Any | None:
    """The committed row that continues ``sample`` (None if none does), its pre-stop part checked.

    ``rows`` are trajectory rows (``input_ids [P+O']``, ``logprobs``, ``versions``); the row must hold
    the sample's ``P`` prompt ids and ``O`` output ids first, with the saved logprobs and versions.
    """
    assert sample.output_ids, "a cut sample with no token continues nothing"
    head = [*sample.input_ids, *sample.output_ids]
    found = [r for r in rows if list(r.input_ids[: len(head)]) == head]
    if not found:
        return None
    (row,) = found  # one row per cut sample: it was continued once
    n_p, n_o = len(sample.input_ids), len(sample.output_ids)
    assert list(row.logprobs[n_p : n_p + n_o]) == [float(x) for x in sample.output_logprobs]
    assert list(row.versions[:n_p]) == [-1] * n_p
    assert list(row.versions[n_p : n_p + n_o]) == sample.output_versions  # the tokens from before the stop
    newest = max(sample.output_versions)
    assert min(row.versions[n_p + n_o :], default=newest) >= newest  # the rest: the same version or newer
    assert len(row.input_ids) <= n_p + sample.max_new_tokens
    assert row.head_version == min(sample.output_versions)  # judged by its oldest token
    return row
