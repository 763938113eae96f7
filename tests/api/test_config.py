"""Config loading: YAML + dotted overrides, strict errors naming the key, redaction, generated docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ConfigError
from rollflow.api.net import is_loopback_host
from rollflow.configuration.loader import flat_params, load_config, render_docs, to_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_cpu_yaml_loads_with_overrides() -> None:
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["train.lr=1e-5", "rollout.max_staleness=0"])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.train.lr == pytest.approx(1e-5)  # '1e-5' is a string in YAML 1.1; coerced for float fields
    assert cfg.rollout.max_staleness == 0
    assert cfg.model.bootstrap_tiny is True


def test_every_shipped_config_loads() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("rollout.max_stalenes=1", "rollout.max_stalenes", "did you mean 'rollout.max_staleness'"),
        ("rollout.max_staleness=-1", "rollout.max_staleness", "must be >= 0"),
        ("train.batch_size=abc", "train.batch_size", "expected an integer"),
        ("train.batch_size=2.5", "train.batch_size", "expected an integer"),
        ("train.lr=fast", "train.lr", "expected a number"),
        ("inference.backend=tgi", "inference.backend", "must be one of"),
        ("train=3", "train", "expected a mapping"),
        ("train.c_clip=0.5", "train.c_clip", "must be > 1"),
        ("model.bootstrap_tiny=maybe", "model.bootstrap_tiny", "expected true/false"),
        ("train.batch_size=5000", "train.batch_size", "exceeds the dataset"),
        ("inference.backend=external", "inference.addresses", "must list host:port"),
        ("nonsense=1", "nonsense", "unknown key"),
    ],
)
def test_bad_values_name_the_key_and_fix(override: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [override])
    assert err.value.key == key
    assert fragment in str(err.value)


def test_bounded_run_larger_than_dataset_is_rejected() -> None:
    # 100 prompts x 1 epoch = 100 groups < 16 groups x 10 steps = 160 needed.
    with pytest.raises(ConfigError, match="train.steps") as err:
        load_config(
            overrides=[
                "dataset.synthetic.n_train=100",
                "rollout.max_epochs=1",
                "train.batch_size=16",
                "train.steps=10",
            ]
        )
    assert "rollout.max_epochs" in str(err.value)


def test_sync_baseline_requires_zero_staleness() -> None:
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        load_config(overrides=["rollout.pause_during_training=true", "rollout.max_staleness=2"])
    cfg = load_config(overrides=["rollout.pause_during_training=true", "rollout.max_staleness=0"])
    assert cfg.rollout.pause_during_training


def test_malformed_override_and_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(overrides=["train.lr"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)


def test_secrets_are_redacted_from_params_and_yaml() -> None:
    cfg = load_config(
        overrides=[
            "storage.options={key: AKIAEXAMPLE, secret: s3cr3t, endpoint_url: http://127.0.0.1:9000}",
            "inference.api_key=topsecret",
        ]
    )
    params = flat_params(cfg)
    dumped = to_yaml(cfg)
    for secret in ("AKIAEXAMPLE", "s3cr3t", "topsecret"):
        assert secret not in str(params)
        assert secret not in dumped
    assert params["storage.options.endpoint_url"] == "http://127.0.0.1:9000"
    assert params["train.lr"] == str(cfg.train.lr)


def test_configuration_doc_is_up_to_date() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == render_docs(), "docs/configuration.md is stale: run `make docs`"


def test_an_absolute_model_path_that_does_not_exist_fails_at_resolution(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="model.path.*does not exist"):
        load_config(overrides=[f"model.path={missing}"])
    load_config(overrides=[f"model.path={missing}", "model.bootstrap_tiny=true"])  # built there
    load_config(overrides=["model.path=Qwen/Qwen2.5-0.5B"])  # relative: maybe a hub name


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "myhost"])
def test_a_non_loopback_host_needs_an_api_key(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_INFERENCE_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="inference.host.*without an API key"):
        load_config(overrides=[f"inference.host={host}"])
    load_config(overrides=[f"inference.host={host}", "inference.api_key=k"])
    monkeypatch.setenv("ROLLFLOW_INFERENCE_API_KEY", "k")
    load_config(overrides=[f"inference.host={host}"])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost"])
def test_loopback_hosts_need_no_api_key(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_INFERENCE_API_KEY", raising=False)
    assert load_config(overrides=[f"inference.host={host}"]).inference.host == host


def test_is_loopback_host() -> None:
    assert all(is_loopback_host(h) for h in ("127.0.0.1", "127.9.9.9", "localhost", "::1", "[::1]"))
    assert not any(is_loopback_host(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


def test_a_user_config_that_sets_no_learning_keys_gets_the_peers_values(tmp_path: Path) -> None:
    """The held-back task's shape (issue 17): a model path, a ``files`` dataset, a ``module:function``
    reward, 16 x 8, lr 5e-5, and nothing about staleness, passes or the curriculum. It gets the peers'
    values (docs/learning.md, "The rule for defaults": a learning default differs from them only where it
    won on the suite's test families, and none has been judged there yet), not values tuned on add_gap or
    sub_gap; the techniques that lost stay off."""
    (tmp_path / "my-model").mkdir()
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    user = tmp_path / "user.yaml"
    user.write_text(
        f"model: {{path: {tmp_path / 'my-model'}}}\n"
        f"dataset: {{kind: files, path: 'train={tmp_path}/train.jsonl,test={tmp_path}/test.jsonl',"
        " reward_fn: 'my_pkg.reward:score'}\n"
        "rollout: {group_size: 8, generation: {max_new_tokens: 8, temperature: 1.0}}\n"
        "train: {batch_size: 16, lr: 5.0e-5}\n"
    )
    cfg = load_config(user)
    assert cfg.rollout.max_staleness == 2  # AReaL's examples (1 won on sub_gap, a dev family)
    assert cfg.train.ppo_epochs == 1  # one pass per batch (2 won on sub_gap, a dev family)
    assert cfg.rollout.max_epochs is None  # unbounded, and still no prompt skipping
    assert cfg.rollout.curriculum_probs() == (0.0, 0.0)  # 0.97 / 0.5 won on add_gap, a dev family
    assert not cfg.rollout.dynamic_sampling  # lost: twice the generation per step
    assert cfg.train.eps_clip_higher is None or cfg.train.eps_clip_higher == cfg.train.eps_clip  # lost
    assert cfg.train.lr_schedule == "constant"  # cosine lost


def test_shipped_configs_keep_the_values_tuned_with_them_and_gsm8k_inherits_none() -> None:
    """configs/tiny_hard.yaml (make demo, add_gap) keeps the values it was measured with, explicitly;
    configs/gsm8k_qwen.yaml sets none of them and so gets the peers' values, not add_gap's."""
    root = Path(__file__).resolve().parents[2]
    demo = load_config(root / "configs" / "tiny_hard.yaml")
    assert (demo.rollout.max_staleness, demo.train.ppo_epochs) == (1, 2)
    assert demo.rollout.curriculum_probs() == (0.97, 0.5) and demo.rollout.curriculum_max_skips is None
    gsm8k = load_config(root / "configs" / "gsm8k_qwen.yaml")
    assert gsm8k.train.ppo_epochs == 1 and gsm8k.rollout.curriculum_probs() == (0.0, 0.0)
