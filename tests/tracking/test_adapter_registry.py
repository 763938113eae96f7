"""A LoRA run's registry entry (issue 20 §3): the adapter with its base's identity, plus the merged model.

A tiny random Llama is the base; a rank-4 adapter with random A and B (B != 0, so it changes what the
model says) is written as the trainer publishes it (``rollflow.training.lora`` + ``write_adapter_dir``)
and committed to a real checkpoint store. The registry gate then runs as the flow's finalize runs it,
into a SQLite MLflow store. Then:

- the registered version (``<experiment>-policy`` v1, alias ``latest-rl``) is the adapter: ``peft/``
  holds the published tensors and no full weights; its tags name the base, the base's weights digest
  (recomputed here with blake3 from the file bytes), the rank, and the merged model; the run's decision
  tags are the ones a full run gets;
- ``mlflow.transformers.load_model`` on it, and peft's own loader on its download, generate greedily
  exactly what the registered merged model (``<experiment>-policy-merged`` v1) generates on the same
  prompt, which is not what the base alone generates; ``mlflow.pyfunc`` answers chat messages the same;
- a retrain's download of the adapter comes back merged; a base with other weights is refused;
- ``tracking.register_merged=false`` registers the adapter only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from rollflow.configuration.loader import load_config
from rollflow.tracking.registry_gate import GateOutcome

PROMPT = "12+14="


@dataclass(frozen=True)
class LoraRun:
    uri: str
    run_id: str
    base: Path
    adapter: Path  # as published
    outcome: GateOutcome
    work: Path


def _tiny_base(path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    from rollflow.models.random_llama import save_random_llama
    from rollflow.models.tokenizer import build_tokenizer

    save_random_llama(path, tokenizer=build_tokenizer())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():  # larger logits than the default init, so greedy choices are clear-cut
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


def _published_adapter(base: Path, out: Path, rank: int) -> Path:
    """The adapter as the trainer publishes it, with random A and B."""
    from transformers import AutoModelForCausalLM

    from rollflow.api.config import LoraConfig
    from rollflow.training.lora import adapter_config, adapter_tensors, apply_lora
    from rollflow.training.publish import write_adapter_dir

    policy = apply_lora(AutoModelForCausalLM.from_pretrained(base), LoraConfig(rank=rank), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    doc = adapter_config(policy, str(base))
    write_adapter_dir(out, adapter_tensors(policy.state_dict()), adapter_config=doc)
    return out


def _gate(tmp: Path, base: Path, adapter: Path, experiment: str, *extra: str) -> tuple[str, GateOutcome]:
    """Commit ``adapter`` as version 3 of a trial and run the registry gate on it; (run id, outcome)."""
    cfg, storage = _trial(tmp, base, adapter, experiment, *extra)
    return _run_gate(cfg, storage)


def _trial(tmp: Path, base: Path, adapter: Path, experiment: str, *extra: str) -> tuple[Any, Any]:
    """A trial whose version 3 is ``adapter`` (committed): (config, storage)."""
    from rollflow.trial.store import open_trial_storage
    from storage.checkpoints import CheckpointStore

    cfg = load_config(
        overrides=[
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp / 'db' / 'mlflow.db'}",
            f"experiment={experiment}",
            "trial=t1",
            f"model.path={base}",
            "train.lora.rank=4",
            f"storage.root={tmp / 'store'}",
            f"storage.local_cache={tmp / 'cache'}",
            *extra,
        ]
    )
    storage = open_trial_storage(cfg)
    CheckpointStore(storage).publish(adapter, 3)
    return cfg, storage


def _run_gate(cfg: Any, storage: Any) -> tuple[str, GateOutcome]:
    """The gate on version 3, in the trial's run (started, or found again as a resumed finalize does)."""
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from rollflow.tracking.registry_gate import apply_registry_gate

    tracker = MlflowTracker(cfg)
    tracker.start()
    try:
        outcome = apply_registry_gate(
            cfg,
            tracker,
            storage,
            final_version=3,
            steps_trained=3,
            eval_accuracy_after=0.5,
            eval_accuracy_before=0.25,
            source_model_version=None,
            lineage_tags=lambda: {"rollflow.lineage.dataset": "add"},
        )
    finally:
        tracker.finish()
    assert tracker.run_id is not None
    return tracker.run_id, outcome


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoraRun]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = tmp_path_factory.mktemp("lora-registry")
    base = _tiny_base(tmp / "base")
    adapter = _published_adapter(base, tmp / "adapter", rank=4)
    run_id, outcome = _gate(tmp, base, adapter, "lorareg")
    yield LoraRun(f"sqlite:///{tmp / 'db' / 'mlflow.db'}", run_id, base, adapter, outcome, tmp)


def _blake3_of_weights(model_dir: Path) -> str:
    """Worked out here from the bytes: blake3 of "name\\tsize\\tblake3(file)\\n" over config.json and the
    safetensors file, sorted by name."""
    from blake3 import blake3

    lines = ""
    for name in ("config.json", "model.safetensors"):
        data = (model_dir / name).read_bytes()
        lines += f"{name}\t{len(data)}\t{blake3(data).hexdigest()}\n"
    return blake3(lines.encode()).hexdigest()


def _greedy(model: Any, tokenizer: Any, n: int = 12) -> list[int]:
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def test_the_registry_gets_the_adapter_with_its_base_identity(lora_run: LoraRun) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    client = MlflowClient(lora_run.uri)
    tags = client.get_run(lora_run.run_id).data.tags
    # the decision tags as for a full run, plus where the merged model went
    assert tags["rollflow.registry.decision"] == "registered"
    assert tags["rollflow.registry.reason"] == "first-version"
    assert tags["rollflow.registry.version"] == "1"
    assert tags["rollflow.registry.merged_model"] == "lorareg-policy-merged v1"
    assert lora_run.outcome.registered_model == "lorareg-policy v1"

    mv = client.get_model_version_by_alias("lorareg-policy", "latest-rl")
    assert str(mv.version) == "1"
    digest = _blake3_of_weights(lora_run.base)
    assert {k: mv.tags[k] for k in ("lora_rank", "lora_base_model", "lora_base_model_blake3")} == {
        "lora_rank": "4",
        "lora_base_model": str(lora_run.base),
        "lora_base_model_blake3": digest,
    }
    assert "lora_base_model_revision" not in mv.tags  # a local directory has no hub revision
    assert mv.tags["merged_model"] == "lorareg-policy-merged v1"
    assert (mv.tags["policy_version"], mv.tags["eval_accuracy"]) == ("3", "0.5000")
    assert mv.tags["rollflow.lineage.dataset"] == "add"

    mlflow.set_tracking_uri(lora_run.uri)
    logged = mlflow.get_logged_model(mv.source.removeprefix("models:/"))
    assert (logged.name, logged.model_type) == ("adapter", "rollflow-lora-adapter")
    assert logged.tags["rollflow.lora_base_model_blake3"] == digest
    local = Path(
        mlflow.artifacts.download_artifacts("models:/lorareg-policy/1", dst_path=str(lora_run.work / "dl"))
    )
    assert not list(local.rglob("model.safetensors"))  # the base's weights are not copied
    registered = load_file(local / "peft" / "adapter_model.safetensors")
    published = load_file(lora_run.adapter / "adapter_model.safetensors")
    assert registered.keys() == published.keys() and len(published) > 0
    assert all(torch.equal(registered[k], published[k]) for k in published)
    assert "rank-4 LoRA adapter" in (local / "model_card.md").read_text()

    merged = client.get_model_version_by_alias("lorareg-policy-merged", "latest-rl")
    assert merged.tags["merged_from"] == "lorareg-policy v1"
    assert merged.tags["lora_base_model_blake3"] == digest


def test_the_registered_adapter_generates_what_the_merged_model_does(lora_run: LoraRun) -> None:
    import mlflow
    import mlflow.transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    mlflow.set_tracking_uri(lora_run.uri)
    adapter = mlflow.transformers.load_model("models:/lorareg-policy/1")
    merged = mlflow.transformers.load_model("models:/lorareg-policy-merged/1")
    assert isinstance(adapter.model, PeftModel) and not isinstance(merged.model, PeftModel)
    tokens = _greedy(adapter.model, adapter.tokenizer)
    assert tokens == _greedy(merged.model, merged.tokenizer)
    base = AutoModelForCausalLM.from_pretrained(lora_run.base, dtype=torch.float32)
    assert tokens != _greedy(base, adapter.tokenizer)  # the adapter changes what the model says

    # peft's own loader on the downloaded files: the same
    local = Path(mlflow.artifacts.download_artifacts("models:/lorareg-policy/1"))
    by_hand = PeftModel.from_pretrained(base, local / "peft")
    assert _greedy(by_hand, adapter.tokenizer) == tokens

    # called as the full policy is: chat messages in, the same greedy answer as the merged model
    messages = {"messages": [{"role": "user", "content": PROMPT}]}
    answers = [
        mlflow.pyfunc.load_model(f"models:/{name}/1").predict(messages)[0]["choices"][0]["message"]["content"]
        for name in ("lorareg-policy", "lorareg-policy-merged")
    ]
    assert answers[0] == answers[1] and answers[0] != "", answers


def test_a_retrain_downloads_it_merged_and_a_foreign_base_is_refused(lora_run: LoraRun) -> None:
    import mlflow
    from safetensors.torch import load_file, save_file

    from rollflow.api.errors import BaseModelMismatchError
    from rollflow.tracking.base_model import check_base_model
    from rollflow.tracking.mlflow_tracker import download_latest_registered

    hf, tags = download_latest_registered(lora_run.uri, "lorareg-policy", lora_run.work / "retrain")
    assert tags["registry_version"] == "1" and (hf / "tokenizer.json").exists()
    ref = mlflow.artifacts.download_artifacts("models:/lorareg-policy-merged/1", tracking_uri=lora_run.uri)
    reference = load_file(Path(ref) / "model" / "model.safetensors")
    retrain = load_file(hf / "model.safetensors")
    assert retrain.keys() == reference.keys()
    assert all(torch.equal(retrain[k], reference[k]) for k in reference)

    # the same files with one weight nudged: another base, refused by its digest
    other = lora_run.work / "other-base"
    other.mkdir()
    (other / "config.json").write_bytes((lora_run.base / "config.json").read_bytes())
    weights = load_file(lora_run.base / "model.safetensors")
    weights["lm_head.weight"] = weights["lm_head.weight"] * 1.001
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BaseModelMismatchError, match="lora_base_model_blake3"):
        check_base_model(other, tags["lora_base_model_blake3"], what="lorareg-policy v1")
    check_base_model(lora_run.base, tags["lora_base_model_blake3"], what="lorareg-policy v1")


def test_register_merged_false_registers_the_adapter_only(lora_run: LoraRun) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    assert load_config().tracking.register_merged is True  # the default: vLLM/SGLang serve it as is
    run_id, outcome = _gate(
        lora_run.work / "adapter-only",
        lora_run.base,
        lora_run.adapter,
        "loraonly",
        "tracking.register_merged=false",
    )
    assert outcome.registered_model == "loraonly-policy v1"
    client = MlflowClient(f"sqlite:///{lora_run.work / 'adapter-only' / 'db' / 'mlflow.db'}")
    assert "rollflow.registry.merged_model" not in client.get_run(run_id).data.tags
    assert "merged_model" not in client.get_model_version("loraonly-policy", "1").tags
    with pytest.raises(MlflowException):
        client.get_registered_model("loraonly-policy-merged")


def test_a_finalize_stopped_after_the_adapter_registered_finishes_without_registering_it_twice(
    lora_run: LoraRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure window of issue 20: the adapter is registered (and the alias moved to it), then merging
    fails. The run holds the decision but no decision tag, so a resumed finalize calls the gate again: it
    keeps the first decision (not "eval-tied" against its own adapter), registers the adapter no second
    time and registers the merged model."""
    from mlflow.tracking import MlflowClient

    import rollflow.training.lora as lora

    def no_disk(*args: Any, **kwargs: Any) -> Path:
        raise OSError("No space left on device")

    tmp = lora_run.work / "half-way"
    cfg, storage = _trial(tmp, lora_run.base, lora_run.adapter, "lorahalf")
    with monkeypatch.context() as patch:
        patch.setattr(lora, "merge_adapter_dir", no_disk)
        with pytest.raises(OSError, match="No space"):
            _run_gate(cfg, storage)
    client = MlflowClient(f"sqlite:///{tmp / 'db' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("lorahalf").experiment_id])[0]
    tags = run.data.tags
    assert tags["rollflow.registry.stage"] == "registering" and "rollflow.registry.decision" not in tags
    assert tags["rollflow.registry.reason"] == "first-version"
    assert [str(v.version) for v in client.search_model_versions("name='lorahalf-policy'")] == ["1"]

    run_id, outcome = _run_gate(cfg, storage)  # the resumed finalize
    assert run_id == run.info.run_id
    assert outcome.registered_model == "lorahalf-policy v1"
    assert outcome.registry_decision == "first-version"
    assert [str(v.version) for v in client.search_model_versions("name='lorahalf-policy'")] == ["1"]
    assert [str(v.version) for v in client.search_model_versions("name='lorahalf-policy-merged'")] == ["1"]
    tags = client.get_run(run_id).data.tags
    assert tags["rollflow.registry.decision"] == "registered" and tags["rollflow.registry.stage"] == "done"
    assert tags["rollflow.registry.merged_model"] == "lorahalf-policy-merged v1"
    assert (
        client.get_model_version("lorahalf-policy", "1").tags["merged_model"] == "lorahalf-policy-merged v1"
    )

    _run_gate(cfg, storage)  # once more, all done: still one version of each
    assert len(client.search_model_versions("name='lorahalf-policy'")) == 1
    assert len(client.search_model_versions("name='lorahalf-policy-merged'")) == 1


def test_a_hub_base_is_identified_by_its_cached_revision(
    lora_run: LoraRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id resolves to the snapshot in the local Hugging Face cache: its commit is the revision, and
    the digest is the bytes' (the same files give the same digest as the local directory)."""
    import huggingface_hub.constants

    from rollflow.api.errors import ConfigError
    from rollflow.tracking.base_model import base_model_identity

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_bytes((lora_run.base / name).read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    ident = base_model_identity("acme/tiny")
    assert (ident.revision, ident.local_dir) == (commit, snapshot.resolve())
    assert ident.tags() == {
        "lora_base_model": "acme/tiny",
        "lora_base_model_blake3": _blake3_of_weights(lora_run.base),
        "lora_base_model_revision": commit,
    }
    with pytest.raises(ConfigError, match="model.path.*neither a local directory nor"):
        base_model_identity("acme/not-cached")
