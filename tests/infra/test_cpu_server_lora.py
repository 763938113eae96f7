"""LoRA adapters on the CPU server: hot load through the watcher, per-token versions, refusals.

One real CPU server on 127.0.0.1 serving the tiny model as its base, one local trial, the real
``CheckpointWatcher`` and ``EngineClient``. Adapters are written by peft itself (``save_pretrained``).
The tests run in order, as versions go up in a run:
v0 (an adapter with B = 0, i.e. the base) already served -> ack only; v1 published in the middle of a
long generation -> tokens of v0 then v1, the continuation is base + adapter 1's; bad adapters sent to
the server are refused with the reason and v1 keeps serving; v2 whose file changed after its commit
(checksum mismatch) is refused by the watcher and v1 keeps serving; v3 merges into the base, not into
v1; full weights loaded afterwards make the server refuse adapters (its base is gone).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from server_waits import until_generating

from infra.cpu_server.adapters import load_checked_adapter
from infra.cpu_server.weights import WeightLoadError
from rollflow.api.inference import GenerateRequest, SamplingParams
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

try:  # the watcher and client are moving to rollflow/inference/
    from rollflow.inference.client import EngineClient
    from rollflow.inference.routing import control_call
    from rollflow.inference.watcher import CheckpointWatcher
except ImportError:  # pragma: no cover
    from rollflow.inference.client import EngineClient
    from rollflow.inference.routing import control_call
    from rollflow.inference.watcher import CheckpointWatcher

PROMPT = [5, 6, 7, 8]
TARGETS = ["q_proj", "v_proj", "down_proj"]


def make_adapter(
    base_dir: Path, out: Path, *, seed: int, rank: int = 4, targets: list[str] = TARGETS, zero_b: bool = False
) -> Path:
    """A peft LoRA adapter of ``base_dir`` with random A and B (B = 0 with ``zero_b``), saved by peft."""
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = peft.LoraConfig(r=rank, lora_alpha=2.0 * rank, target_modules=targets, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
                if zero_b and ".lora_B." in name:
                    p.zero_()
    model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)  # a model card; the served version is the two files
    return out


def merged_model(base_dir: Path, adapter_dir: Path, out: Path) -> Path:
    """peft's own merge of the adapter into the base, saved as a full model (the reference)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().save_pretrained(out)
    return out


def greedy(addr: str, n: int = 24) -> list[int]:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }
    return control_call(addr, "/generate", body)["output_ids"]


def update(addr: str, model_path: Path, version: str) -> tuple[int, dict[str, Any]]:
    """POST /update_weights_from_disk; (HTTP status, reply) whatever the status."""
    body = json.dumps({"model_path": str(model_path), "weight_version": version}).encode()
    req = urllib.request.Request(f"http://{addr}/update_weights_from_disk", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def served_version(addr: str) -> str:
    return str(control_call(addr, "/get_model_info")["weight_version"])


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, inference_lib: Any) -> Any:
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        yield group


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def store(work: Path) -> CheckpointStore:
    return CheckpointStore(Storage.open(str(work / "store"), "exp", "lora"))


def test_adapter_published_mid_generation_is_hot_loaded_with_per_token_versions(
    server: Any, store: CheckpointStore, work: Path, tiny_model_dir: Path, inference_lib: Any
) -> None:
    addr = server.addresses[0]
    store.publish(make_adapter(tiny_model_dir, work / "a0", seed=0, zero_b=True), 0)
    a1 = make_adapter(tiny_model_dir, work / "a1", seed=1)
    n_new = 400

    async def go() -> Any:
        client = EngineClient(server.addresses)
        w = CheckpointWatcher(
            store,
            server.addresses,
            cache_dir=work / "cache",
            poll_interval_s=0.05,
            on_update=client.set_version,
        )
        assert w.poll_once() == 0 and w.events[-1].pause_s == 0.0  # "0" (the base) already served
        w.start()
        try:
            req = GenerateRequest(
                PROMPT, SamplingParams(max_new_tokens=n_new, temperature=0.0, ignore_eos=True)
            )
            task = asyncio.create_task(client.agenerate(req))
            await until_generating(addr, 40)
            ref = await asyncio.to_thread(store.publish, a1, 1)
            assert ref.is_adapter and store.get(0).is_adapter
            return await task
        finally:
            w.stop()
            await client.aclose()

    r = asyncio.run(go())
    k = r.output_versions.index(1)
    assert 40 <= k < n_new and r.output_versions == [0] * k + [1] * (n_new - k)
    assert served_version(addr) == "1"
    ids, n_p = PROMPT + r.output_ids, len(PROMPT)
    # before k the base's greedy tokens and logprobs, after k those of base + adapter 1 (peft's merge)
    merged = merged_model(tiny_model_dir, a1, work / "m1")
    for model_dir, lo, hi in ((tiny_model_dir, n_p, n_p + k), (merged, n_p + k, len(ids))):
        logits = inference_lib.teacher_forced_logits(model_dir, ids)  # [T, V]
        for t in range(lo, hi):
            assert logits[t - 1, ids[t]] >= logits[t - 1].max() - 1e-4, f"token {t} is not {model_dir.name}'s"
        ref = inference_lib.teacher_forced_logprobs(model_dir, ids, n_p)[lo - n_p : hi - n_p]
        got = r.output_logprobs[lo - n_p : hi - n_p]
        assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4


def _bad_adapters(work: Path, tiny_model_dir: Path, inference_lib: Any) -> dict[str, tuple[Path, str]]:
    good = make_adapter(tiny_model_dir, work / "good", seed=5)
    out: dict[str, tuple[Path, str]] = {}

    def variant(name: str, edit_config: dict[str, Any] | None = None) -> Path:
        d = work / f"bad-{name.replace(' ', '-')}"
        shutil.copytree(good, d)
        if edit_config:
            doc = json.loads((d / "adapter_config.json").read_text())
            (d / "adapter_config.json").write_text(json.dumps({**doc, **edit_config}))
        return d

    out["wrong rank"] = (
        variant("wrong rank", {"r": 8}),
        "the tensors have rank 4, adapter_config.json says r = 8",
    )
    out["target module the model lacks"] = (
        variant("missing target", {"target_modules": ["q_proj", "qkv_proj"]}),
        "target module(s) ['qkv_proj'] of the adapter are not in the served model",
    )
    d = variant("missing layer")
    tensors = load_file(str(d / "adapter_model.safetensors"))
    tensors = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    save_file(tensors, str(d / "adapter_model.safetensors"))
    out["a layer the model lacks"] = (d, "'model.layers.7.mlp.down_proj', which is not a linear layer")
    other_base = inference_lib.write_tiny_model(
        work / "other-base", seed=3, hidden_size=32, intermediate_size=64
    )
    out["another base model"] = (
        make_adapter(other_base, work / "other-adapter", seed=6),
        "the adapter was trained on another base model",
    )
    out["DoRA"] = (
        variant("dora", {"use_dora": True}),
        "not supported by the CPU server's merge: use_dora=True",
    )
    d = variant("nan")
    tensors = load_file(str(d / "adapter_model.safetensors"))
    next(v for k, v in tensors.items() if "lora_B" in k)[0, 0] = float("nan")
    save_file(tensors, str(d / "adapter_model.safetensors"))
    out["NaN"] = (d, "NaN or inf")
    return out


def test_mismatched_adapters_are_refused_and_the_old_adapter_keeps_serving(
    server: Any, work: Path, tiny_model_dir: Path, inference_lib: Any
) -> None:
    addr = server.addresses[0]
    assert served_version(addr) == "1"
    before = greedy(addr)
    for name, (path, fragment) in _bad_adapters(work, tiny_model_dir, inference_lib).items():
        status, body = update(addr, path, "9")
        assert status == 400 and body["success"] is False, name
        assert fragment in body["message"], (name, body["message"])
        assert greedy(addr) == before and served_version(addr) == "1", name


def test_an_adapter_whose_checksum_does_not_match_is_refused_by_the_watcher(
    server: Any, store: CheckpointStore, work: Path, tiny_model_dir: Path
) -> None:
    addr = server.addresses[0]
    before = greedy(addr)
    store.publish(make_adapter(tiny_model_dir, work / "a2", seed=2), 2)
    path = store.storage.local_path("checkpoints/v000002/adapter_model.safetensors")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, one bit pattern changed after the commit
    path.write_bytes(bytes(data))
    w = CheckpointWatcher(store, server.addresses, cache_dir=work / "cache")
    assert w.poll_once() is None  # refused before any server is asked to load it
    assert w.events[-1].kind == "error" and "adapter_model.safetensors" in w.events[-1].message
    assert served_version(addr) == "1" and greedy(addr) == before


def test_adapters_merge_into_the_base_and_full_weights_end_adapter_serving(
    server: Any, work: Path, tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any
) -> None:
    addr = server.addresses[0]
    a3 = make_adapter(tiny_model_dir, work / "a3", seed=3)
    assert update(addr, a3, "3")[0] == 200
    # base + adapter 3, not base + adapter 1 + adapter 3
    ids = PROMPT + greedy(addr)
    logits = inference_lib.teacher_forced_logits(merged_model(tiny_model_dir, a3, work / "m3"), ids)
    assert all(logits[t - 1, ids[t]] >= logits[t - 1].max() - 1e-4 for t in range(len(PROMPT), len(ids)))

    assert update(addr, tiny_model_dir_b, "4")[0] == 200
    status, body = update(addr, a3, "5")
    assert status == 400 and "restart it from the adapter's base model" in body["message"]
    assert served_version(addr) == "4"


def test_rank_above_the_servers_limit_is_refused(work: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base = {n: p.data for n, p in model.named_parameters()}
    adapter = make_adapter(tiny_model_dir, work / "r8", seed=8, rank=8)
    with pytest.raises(WeightLoadError, match="adapter rank 8 exceeds the server's max_lora_rank 4"):
        load_checked_adapter(model, base, str(adapter), max_rank=4)
    merged = load_checked_adapter(model, base, str(adapter), max_rank=8)
    assert merged["lm_head.weight"] is base["lm_head.weight"]  # untouched layers are not copied
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
