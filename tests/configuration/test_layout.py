"""n_servers / server_threads: auto — the rule of rollflow.configuration.layout, and where it is refused."""

from __future__ import annotations

import pytest

from rollflow.api.errors import ConfigError
from rollflow.configuration.layout import describe_layout, resolve_layout
from rollflow.configuration.loader import load_config

AUTO = ["inference.n_servers=auto", "inference.server_threads=auto"]


@pytest.mark.parametrize(
    ("cores", "overrides", "expected"),
    [
        (2, ["train.threads=1"], (1, 1)),  # this machine: the trainer's core, generation's core
        (16, ["train.threads=4"], (1, 12)),  # generation gets what the trainer leaves
        (1, ["train.threads=1"], (1, 1)),  # never below one thread
        (8, ["train.threads=2", "inference.n_servers=2"], (2, 3)),  # a given server count splits the rest
        (8, ["train.threads=2", "inference.server_threads=5"], (1, 5)),  # a given thread count is kept
        (
            4,
            ["train.threads=2", "rollout.pause_during_training=true", "rollout.max_staleness=0"],
            (1, 4),
        ),  # sync
    ],
)
def test_the_rule(cores: int, overrides: list[str], expected: tuple[int, int]) -> None:
    raw = load_config("configs/tiny_cpu.yaml", [*AUTO, *overrides])  # resolved for this machine; redo it
    cfg = resolve_layout(_unresolved(raw, overrides), cores=cores)
    assert (cfg.inference.n_servers, cfg.inference.server_threads) == expected
    assert f"{cores} usable core(s)" in describe_layout(cfg, cores=cores)


def _unresolved(cfg, overrides: list[str]):
    import dataclasses

    given = {o.split("=")[0] for o in overrides}
    inf = cfg.inference
    return dataclasses.replace(
        cfg,
        inference=dataclasses.replace(
            inf,
            n_servers=inf.n_servers if "inference.n_servers" in given else "auto",
            server_threads=inf.server_threads if "inference.server_threads" in given else "auto",
        ),
    )


def test_the_tiny_configs_default_to_auto_and_load_as_numbers() -> None:
    for name in ("tiny_cpu", "tiny_hard", "tiny_hard2"):
        cfg = load_config(f"configs/{name}.yaml")
        assert isinstance(cfg.inference.n_servers, int) and isinstance(cfg.inference.server_threads, int)
        assert cfg.inference.n_servers == 1 and cfg.inference.server_threads >= 1


def test_auto_is_refused_for_gpu_engines_and_bad_values_are_named() -> None:
    with pytest.raises(ConfigError, match=r"inference.n_servers.*backend sglang on GPUs.*rollflow plan"):
        load_config("configs/gsm8k_qwen.yaml", ["inference.n_servers=auto", "inference.sglang.device=cuda"])
    # SGLang on the CPU is sized like the CPU server: the cores the trainer leaves
    cpu = load_config("configs/tiny_cpu.yaml", ["inference.backend=sglang", "inference.sglang.device=cpu"])
    assert cpu.inference.n_servers == 1 and isinstance(cpu.inference.server_threads, int)
    with pytest.raises(ConfigError, match=r"inference.server_threads.*>= 1 or auto"):
        load_config("configs/tiny_cpu.yaml", ["inference.server_threads=0"])
    with pytest.raises(ConfigError, match=r"expected int \| 'auto'"):
        load_config("configs/tiny_cpu.yaml", ["inference.n_servers=many"])


def test_gpu_split_from_rates() -> None:
    from rollflow.configuration.layout import recommend_gpu_split

    split = recommend_gpu_split(train_seqs_per_s=100.0, gen_seqs_per_s=30.0, trainer_gpus=4, tp_size=2)
    assert (split.servers, split.inference_gpus) == (4, 8)  # ceil(100 / 30) = 4 servers of 2 GPUs
    assert "ceil(100 seq/s trained / 30 seq/s per server) = 4" in split.arithmetic
    assert recommend_gpu_split(train_seqs_per_s=60.0, gen_seqs_per_s=30.0, trainer_gpus=1).servers == 2
    assert recommend_gpu_split(train_seqs_per_s=1.0, gen_seqs_per_s=30.0, trainer_gpus=1).servers == 1
    with pytest.raises(ConfigError, match="gen_seqs_per_s > 0"):
        recommend_gpu_split(train_seqs_per_s=1.0, gen_seqs_per_s=0.0, trainer_gpus=1)
