"""``rollflow inspect``'s words: the trial as the word after the command, and its recorded tokenizer.

What it is: ``inspect_argv`` turns ``inspect TRIAL ...`` into the words of ``rollflow.rollout.inspect``'s
own parser (``--trial TRIAL``, the default ``--config``; the old ``trial=T`` still works and says so) and
``recorded_tokenizer`` adds ``--tokenizer`` from the trial's config record. No Prefect import.
"""

from __future__ import annotations

from pathlib import Path

from flows.cli.paths import DEFAULT_CONFIG, deprecated
from rollflow.configuration.loader import load_config


def inspect_argv(argv: list[str]) -> list[str]:
    """``inspect TRIAL ...`` in the words of ``rollflow.rollout.inspect``'s parser: ``--trial TRIAL`` and,
    unless a store is named, the default ``--config`` (``trial=T``, the old spelling, still works)."""
    out: list[str] = []
    trial = None
    takes_value = {"--config", "--storage-root", "--experiment", "--trial", "--tokenizer", "--limit",
                   "--width", "--min-reward", "--max-reward", "--version", "--prompt", "--storage-option"}  # fmt: skip
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in takes_value and i + 1 < len(argv):
            out += [word, argv[i + 1]]
            i += 2
            continue
        if word.startswith("trial="):
            deprecated("inspect", word, f"rollflow inspect {word[6:]}")
            trial = word[6:]
        elif not word.startswith("-") and "=" not in word and trial is None and "--trial" not in argv:
            trial = word
        else:
            out.append(word)
        i += 1
    if trial is not None:
        out += ["--trial", trial]
    if "--config" not in out and "--storage-root" not in out and not {"-h", "--help"} & set(out):
        out += ["--config", DEFAULT_CONFIG]
    return out


def recorded_tokenizer(words: list[str]) -> list[str]:
    """``--tokenizer`` from the trial's own config record (its ``model.path``), when none is given: a
    trial of another config (an ``RLRun`` trial, another task) is decoded with its own model's tokenizer."""
    if "--tokenizer" in words or "--trial" not in words or "--config" not in words:
        return words
    from rollflow.trial.record import read_config_record
    from rollflow.trial.store import open_trial_storage

    trial = words[words.index("--trial") + 1]
    overrides = [w for w in words if "=" in w and not w.startswith("-")]
    try:
        cfg = load_config(words[words.index("--config") + 1], [*overrides, f"trial={trial}"])
        record = read_config_record(open_trial_storage(cfg))
    except Exception:  # only a better default: inspect itself says what is wrong with the names
        return words
    path = (record or {}).get("config", {}).get("model", {}).get("path")
    return [*words, "--tokenizer", path] if isinstance(path, str) and Path(path).is_dir() else words
