"""The `rollflow` console script: inspect with filters (without importing Prefect or torch), plan, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter

ROOT = Path(__file__).resolve().parents[2]


def _write_trial(root: Path, tok_dir: Path) -> None:
    from rollflow.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tok_dir)
    storage = Storage.open(str(root), "exp", "t1")
    with ShardWriter(storage, "w", flush_rows=2) as writer:
        for i, (a, answer, head, reward) in enumerate([(1, "2", 3, 1.0), (2, "5", 4, 0.0), (3, "6", 5, 1.0)]):
            p = tok.encode(f"<|im_start|>user\n{a}+{a}=?<|im_end|>\n", add_special_tokens=False)
            c = tok.encode(f"{answer}<|im_end|>", add_special_tokens=False)
            row = TrajectoryRow.build(
                traj_id=f"g{i}-0", group_id=f"g{i}", prompt_id=f"p{i}", input_ids=p + c,
                loss_mask=[0] * len(p) + [1] * len(c), logprobs=[0.0] * len(p) + [-0.5] * len(c),
                versions=[-1] * len(p) + [head] * len(c), reward=reward, finish_reason="stop",
            )  # fmt: skip
            writer.add(TrajectoryGroup(f"g{i}", f"p{i}", [row]))


def _inspect(tmp_path: Path, *extra: str, status: int | None = None) -> list[str]:
    code = (
        "import sys; from flows.cli import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('prefect', 'torch', 'transformers') if m in sys.modules]; "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    args = ["inspect", "--storage-root", str(tmp_path / "st"), "--experiment", "exp", "--trial", "t1"]
    args += ["--tokenizer", str(tmp_path / "tok"), "--limit", "0", *extra]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr  # what keeps a call around a second
    if status is not None:
        assert out.returncode == status, out.stdout + out.stderr
    return out.stdout.splitlines() + out.stderr.splitlines()


def test_inspect_filters_by_reward_version_and_prompt(tmp_path: Path) -> None:
    _write_trial(tmp_path / "st", tmp_path / "tok")
    lines = _inspect(tmp_path)
    assert "3 rows" in lines
    lines = _inspect(tmp_path, "--min-reward", "0.5")
    assert "2 rows" in lines and not any("5<|im_end|>" in ln for ln in lines)
    lines = _inspect(tmp_path, "--version", "4:")
    assert (
        "2 rows" in lines
        and any(ln.startswith("v5 ") for ln in lines)
        and not any(ln.startswith("v3 ") for ln in lines)
    )
    lines = _inspect(tmp_path, "--prompt", "2+2", "--max-reward", "0")
    assert "1 rows" in lines and any("5<|im_end|>" in ln for ln in lines)


def test_plan_and_bad_version_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    assert main(["plan", "--config", str(ROOT / "configs" / "gsm8k_qwen.yaml"), "--image", "reg/r:gpu"]) == 0
    out = capsys.readouterr().out
    plan = json.loads(out[out.index("{\n") :])
    assert plan["gpus"] == {"rollout": 4, "train": 8, "eval": 1, "total": 13}
    with pytest.raises(SystemExit):
        main(
            [
                "inspect",
                "--storage-root",
                str(tmp_path),
                "--experiment",
                "e",
                "--trial",
                "t",
                "--version",
                "x",
            ]
        )
    assert "LO:HI" in capsys.readouterr().err


def test_console_script_is_declared_for_an_existing_module() -> None:
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["rollflow"]
    module, func = target.split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), func))


def test_inspect_says_whether_the_trial_or_the_filters_found_nothing(tmp_path: Path) -> None:
    _write_trial(tmp_path / "st", tmp_path / "tok")
    lines = _inspect(tmp_path, "--min-reward", "5", status=1)
    assert "no committed trajectory matches the filters" in lines
    assert not any("no such trial" in ln for ln in lines)
    lines = _inspect(
        tmp_path, "--min-reward", "1", "--trial", "t9", status=2
    )  # the README's line, a wrong name
    (line,) = [ln for ln in lines if "no such trial" in ln]
    assert line.startswith("rollflow inspect: error: no such trial: t9 under ") and "trials there: t1" in line
    assert "`rollflow ls`" in line and not any("matches the filters" in ln for ln in lines)


def test_plan_without_an_image_says_what_to_type_without_a_traceback() -> None:
    """`rollflow plan --config configs/gsm8k_qwen.yaml`, as prefect-gpu.yaml wrote it (issue 27)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}  # no ROLLFLOW_IMAGE
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "plan", "--config", "configs/gsm8k_qwen.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.startswith("rollflow plan: error: no container image")
    assert "--image <registry>/rollflow:gpu" in out.stderr and "ROLLFLOW_IMAGE" in out.stderr


def test_plan_prints_a_summary_first_and_resolves_as_the_gpu_deployment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flows.cli import main

    assert main(["plan", "--config", "configs/gsm8k_qwen.yaml", "--image", "reg/r:gpu"]) == 0
    out = capsys.readouterr().out
    summary = out[: out.index("\n\n")].splitlines()
    assert summary[0].startswith("GPU plan for configs/gsm8k_qwen.yaml") and len(summary) <= 12
    assert any("distributed" in ln and "train/gpu" in ln for ln in summary)
    assert "  GPUs:    13 in all (1 x 4 rollout + 8 train + 1 eval)" in summary  # one eval server, not 4
    assert "  mode: distributed\n" in out and "mode: embedded" not in out  # async-rl/gpu's override
    assert any(ln.startswith("  split:   give --train-seqs-per-s") for ln in summary)


def test_plan_sizes_generation_to_the_trainer_from_measured_rates(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    args = ["plan", "--config", "configs/gsm8k_qwen.yaml", "--image", "reg/r:gpu"]
    assert main([*args, "--train-seqs-per-s", "200", "--gen-seqs-per-s", "35"]) == 0
    out = capsys.readouterr().out
    split = next(ln for ln in out.splitlines() if ln.startswith("  split:"))
    assert "ceil(200 seq/s trained / 35 seq/s per server) = 6" in split and "configured: 4" in split
    assert main([*args, "--train-seqs-per-s", "200"]) == 2
    assert "give both" in capsys.readouterr().err


def _trial_cli(root: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from flows.cli import main

    rc = main([*command, f"storage.root={root}", "experiment=exp"])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_run_resume_and_eval_refuse_a_wrong_trial_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before Prefect starts: a line naming the trials there and the command to type, status 2."""
    root = tmp_path / "st"
    _write_trial(root, tmp_path / "tok")  # trial t1 holds trajectories, no checkpoint
    rc, err = _trial_cli(root, ["resume", "t2"], capsys)
    assert rc == 2 and err.startswith("rollflow resume: error: trial 't2' holds no data")
    assert "trials there: t1" in err and "`rollflow run`" in err and "Traceback" not in err
    rc, err = _trial_cli(root, ["run", "--trial", "t1"], capsys)
    assert rc == 2 and "already holds data" in err and "`rollflow resume t1`" in err
    rc, err = _trial_cli(root, ["eval", "t1"], capsys)
    assert rc == 2 and "trial 't1' has no committed checkpoint" in err and "trials there: t1" in err
    rc, err = _trial_cli(root, ["run", "trian.steps=3"], capsys)
    assert rc == 2 and err.startswith("rollflow run: error: config key 'trian'") and "'trial'" in err


def _stored_trials(root: Path) -> None:
    """Four trials, one in each state storage can tell (storage/trial_list.py)."""
    import os
    import time

    def put(trial: str, key: str, doc: dict, age_s: float = 0.0) -> None:
        storage = Storage.open(str(root), "exp", trial)
        storage.put_json(key, doc)
        if age_s:
            t = time.time() - age_s
            os.utime(storage.local_path(key), (t, t))

    put("a-final", "checkpoints/LATEST", {"version": 5, "path": "x"}, age_s=3600)
    put("a-final", "eval/v000003.json", {"version": 3, "accuracy": 0.9})
    put("a-final", "eval/v000005.json", {"version": 5, "accuracy": 0.8})
    put("a-final", "trainer/DONE.json", {"version": 5})
    put("a-final", "FINALIZED.json", {"final_version": 5, "eval_accuracy_after": 0.8})
    put("b-trained", "checkpoints/LATEST", {"version": 4, "path": "x"}, age_s=3600)
    put("b-trained", "trainer/DONE.json", {"version": 4})
    put("c-running", "checkpoints/LATEST", {"version": 2, "path": "x"}, age_s=3600)
    put("c-running", "rollout/state-rollout-w0.json", {"updated_at": time.time() - 5})  # a live heartbeat
    put("d-stopped", "checkpoints/LATEST", {"version": 1, "path": "x"}, age_s=3600)
    put("d-stopped", "rollout/state-rollout-w0.json", {"updated_at": time.time() - 3600})
    put("e-old", "FINALIZED.json", {"final_version": 9, "eval_accuracy_after": 0.75})  # before eval records
    put("f-publishing", "checkpoints/LATEST", {"version": 7, "path": "x"})  # a checkpoint just published


def test_ls_lists_trials_with_status_version_and_best_accuracy_without_prefect(tmp_path: Path) -> None:
    _stored_trials(tmp_path / "st")
    code = (
        "import sys; from flows.cli import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('prefect', 'torch', 'transformers') if m in sys.modules]; "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    args = ["ls", "--config", "configs/tiny_cpu.yaml", f"storage.root={tmp_path / 'st'}", "experiment=exp"]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0 and "HEAVY []" in out.stdout, out.stdout + out.stderr
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines()[1:7]}
    assert out.stdout.splitlines()[0].split() == ["trial", "status", "version", "best", "accuracy"]
    assert rows == {
        "a-final": ["finalized", "5", "0.900", "(v3)"],  # the best record, not the final score
        "b-trained": ["trained", "4", "-"],
        "c-running": ["running", "2", "-"],  # LATEST is old, the rollout's heartbeat is not
        "d-stopped": ["stopped", "1", "-"],  # quiet for longer than rollout.worker_lease_s
        "e-old": ["finalized", "9", "0.750", "(v9)"],  # only FINALIZED.json's final score
        "f-publishing": ["running", "7", "-"],  # no heartbeat, but LATEST is fresh
    }, out.stdout
    assert f"6 trial(s) under {tmp_path / 'st' / 'exp'}" in out.stdout


def test_ls_on_an_experiment_with_no_trials_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import main

    assert main(["ls", f"storage.root={tmp_path}", "experiment=none"]) == 0
    assert capsys.readouterr().out.startswith(f"no trial is stored under {tmp_path / 'none'}")


def test_inspect_trial_decodes_with_the_tokenizer_the_trial_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rollflow inspect TRIAL` on a trial of another config (an RLRun trial): its own model's tokenizer,
    from its config record, not the default config's model (which need not exist here)."""
    from flows.cli import main
    from rollflow.configuration.loader import load_config
    from rollflow.trial.record import write_config_record

    root = tmp_path / "st"
    _write_trial(root, tmp_path / "tok")
    cfg = load_config(data={"experiment": "exp", "trial": "t1", "model": {"path": str(tmp_path / "tok")}})
    write_config_record(Storage.open(str(root), "exp", "t1"), cfg)
    assert (
        main(
            ["inspect", "t1", f"storage.root={root}", "experiment=exp", "model.path=/nowhere", "--limit", "0"]
        )
        == 0
    )
    assert "3 rows" in capsys.readouterr().out
