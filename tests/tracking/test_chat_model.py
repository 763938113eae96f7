"""The registered policy serves as users call it (issue 21 §4): chat messages in, the trained answer out.

A tiny model trained on a task (the embedded default's warm-started Llama: it learned ``a+b=`` on the
``add_habit`` train problems, with the right sum wherever an operand is round) is registered through
``MlflowTracker.register_checkpoint``, as the flow does, in a SQLite store. Then:

- it is an MLflow 3 logged model in the run's experiment (``mlflow.search_logged_models``), and the
  registered version's source is that model (``models:/m-...``);
- ``mlflow.pyfunc`` ``predict({"messages": [...]})`` answers what the training-time rendering (the chat
  template through ``render_chat``, tokens without special tokens added) gives under greedy decoding, and
  the right sum on the round-operand problems it learned;
- registration prints no model-card or license warning, and the card says what the model is;
- ``mlflow models serve --env-manager local`` on 127.0.0.1 accepts ``{"messages": [...]}`` over HTTP and
  answers the same (slow: the server takes ~25 s to start).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollflow.configuration.loader import load_config
from rollflow.data.tasks.add_habit import AdditionProblem, sample_problems

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME_OF_TRIAL = "tiny-arith-policy"  # the registered name: {experiment}-policy


@dataclass(frozen=True)
class Registered:
    tracking_uri: str
    run_id: str
    experiment_id: str
    model_dir: Path  # the checkpoint that was registered
    warnings: list[str]


def _problems() -> list[AdditionProblem]:
    """Train problems the model learned: eight with a round operand (learned right) and four without."""
    pool = sample_problems("train", 80, seed=3)
    return [p for p in pool if p.round_operand][:8] + [p for p in pool if not p.round_operand][:4]


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    from rollflow.models.bootstrap import bootstrap_for
    from rollflow.tracking.mlflow_tracker import MlflowTracker

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = tmp_path_factory.mktemp("chat-model")
    uri = f"sqlite:///{tmp / 'db' / 'mlflow.db'}"
    cfg = load_config(
        ROOT / "configs/tiny_cpu.yaml",
        [f"model.path={ROOT / 'runs/models/tiny'}", f"tracking.mlflow_tracking_uri={uri}", "trial=t1"],
    )
    model_dir = bootstrap_for(cfg)  # built once per machine (cached, deterministic)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    mlflow_logger = logging.getLogger("mlflow")
    mlflow_logger.addHandler(handler)
    try:
        tracker = MlflowTracker(cfg)
        tracker.start()
        version = tracker.register_checkpoint(model_dir, version=5, extra_tags={"eval_accuracy": "0.2100"})
        tracker.finish()
    finally:
        mlflow_logger.removeHandler(handler)
    assert version == "1"
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    exp = tracker.client.get_run(tracker.run_id).info.experiment_id
    yield Registered(uri, tracker.run_id, exp, Path(model_dir), warnings)


def _training_time_answer(model_dir: Path, messages: list[dict[str, str]], max_new_tokens: int) -> str:
    """Greedy generation on the prompt as rollouts and evaluation render it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollflow.workflows.blocks import render_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok.encode(render_chat(tok, messages, add_generation_prompt=True), add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id
        )
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


def _content(reply: Any) -> str:
    """``choices[0].message.content`` of the one chat completion in a reply (a list of one)."""
    (completion,) = reply
    assert completion["object"] == "chat.completion", completion
    return completion["choices"][0]["message"]["content"]


def test_the_registered_model_is_a_logged_chat_model(registered: Registered) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(registered.tracking_uri)
    (logged,) = mlflow.search_logged_models(experiment_ids=[registered.experiment_id], output_format="list")
    assert (logged.name, logged.source_run_id) == ("model", registered.run_id)
    assert logged.tags["rollflow.policy_version"] == "5"
    mv = MlflowClient(registered.tracking_uri).get_model_version(MODEL_NAME_OF_TRIAL, "1")
    assert mv.source == f"models:/{logged.model_id}" and mv.run_id == registered.run_id

    info = mlflow.models.get_model_info(f"models:/{MODEL_NAME_OF_TRIAL}/1")
    assert info.flavors["transformers"]["inference_task"] == "llm/v1/chat"
    assert "messages" in info.signature.inputs.input_names()
    # no "model card could not be retrieved" / "unable to find license information" at registration
    assert not [w for w in registered.warnings if "card" in w.lower() or "license" in w.lower()], (
        registered.warnings
    )
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL_NAME_OF_TRIAL}/1"))
    card = (local / "model_card.md").read_text()
    assert "trial t1, version 5" in card and '{"messages": [' in card, card
    assert "license: apache-2.0" in (local / "model_card_data.yaml").read_text()
    assert "declared license type is: 'apache-2.0'" in (local / "LICENSE.txt").read_text()


def test_pyfunc_predict_on_chat_messages_answers_as_in_training(registered: Registered) -> None:
    import mlflow

    mlflow.set_tracking_uri(registered.tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME_OF_TRIAL}/1")
    learned = 0
    for p in _problems():
        messages = [{"role": "user", "content": p.text}]
        reply = model.predict({"messages": messages})
        assert reply[0]["model"] == MODEL_NAME_OF_TRIAL  # its registered name, not the base model's path
        served = _content(reply)
        assert served == _training_time_answer(registered.model_dir, messages, max_new_tokens=8), p.text
        if p.round_operand:  # learned right in its training: the served answer is the sum
            assert served == p.answer, (p.text, served)
            learned += 1
    assert learned == 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_mlflow_models_serve_answers_chat_messages_over_http(registered: Registered, tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": registered.tracking_uri,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its uvicorn
        "HF_HUB_OFFLINE": "1",
    }
    log = tmp_path / "serve.log"
    cmd = [
        str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", f"models:/{MODEL_NAME_OF_TRIAL}/1",
        "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/invocations"
        for p in _problems()[:3]:
            messages = [{"role": "user", "content": p.text}]
            reply = _post(url, {"messages": messages})
            assert _content(reply) == p.answer, (p.text, reply)
        # a request's own max_tokens and an OpenAI client's temperature 0 are accepted (decoding stays greedy)
        p = _problems()[0]
        reply = _post(
            url, {"messages": [{"role": "user", "content": p.text}], "max_tokens": 8, "temperature": 0}
        )
        assert _content(reply) == p.answer
        with pytest.raises(urllib.error.HTTPError) as err:  # a prompt that is not chat messages is refused
            _post(url, {"prompt": p.text})
        assert err.value.code == 400
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
