"""TRL's GRPOTrainer as a peer baseline: one timed GRPO run on CPU from a JSON spec, weight snapshots out.

What it is: the TRL side of the side-by-side benchmark. `bench/peer.py` writes a spec, runs this script
with the TRL venv's python, and scores the snapshots it leaves behind. The step's geometry matches
rollflow's (../shared/notes/stack.md section 7): `batch_prompts` prompts x `group_size` completions per
optimizer step, one AdamW step per generation, no reference model when beta == 0, TRL's defaults for the
loss (loss_type "dapo", scale_rewards "group", epsilon 0.2). TRL is synchronous: each step generates with
the current weights, then trains on what it generated; nothing overlaps.

The reward is the task's own function, named by `reward_fn` ("pkg.module:function", the config's
`dataset.reward_fn`) and imported by name, so both systems are scored by the same code; it is called as
rollflow calls it (rollflow/rewards/protocol.py): `fn(prompt, completion, answer, **data)` with the last
user message, the completion text (TRL decodes with skip_special_tokens=True, as rollflow does), the
answer and the prompt's `data`. A reward that raises or returns a non-number scores 0, as in rollflow.
Without `reward_fn`, exact match of the stripped completion.

What it is not: part of rollflow. Its own imports are torch, transformers, trl, datasets, safetensors and
the stdlib - never rollflow, prefect or mlflow - so it runs in its own venv and TRL never becomes a
rollflow dependency (the reward module is the task's; rollflow's built-in rewards import only their own
package). It does not evaluate: scoring the snapshots is the harness's job.

Run:
    make trl-venv                                   # .venv-trl: torch 2.13.0 CPU + bench/requirements-trl.txt
    .venv-trl/bin/python bench/peer_trl.py SPEC.json

SPEC.json keys (required unless marked optional; unknown keys are reported on stderr and ignored):
    model_path        save_pretrained dir of a causal LM + tokenizer with a chat template (eos ends a turn)
    prompts           [{"messages": [{"role": "user", "content": ...}], "answer": "42", "data": {...}}, ...]
                      in the order to use ("data", optional: the row's other fields); cycled when exhausted
    seed, seconds, max_steps, snapshot_every_s, lr, batch_prompts, group_size, max_new_tokens,
    temperature, grad_clip, beta, threads, out_dir
    reward_fn         optional: "pkg.module:function", the reward (default: exact match)
    snapshot_steps    optional: optimizer steps after which a snapshot is also taken

The clock: seconds since training started (after TRL has built the dataloader and optimizer, just before
the first batch is drawn), minus the time this script spends taking snapshots. Training stops at the
first step end where the clock reaches `seconds`, or after `max_steps`.

Writes to out_dir (which must not already hold results):
    snap-NNN.safetensors   policy weights at clock 0, at each step end where the clock crossed a multiple
                           of snapshot_every_s or the step is in snapshot_steps, and at the end. Keys are the model's state_dict keys;
                           tied weights come out as two equal tensors (embed_tokens and lm_head), and
                           `load_state_dict(..., strict=True)` into from_pretrained's model accepts them.
    curve.json             {"system": "trl", "trl_version", "seed", "steps", "train_seconds", "completions",
                           "completions_per_s", "step_seconds" (per step, sums to train_seconds),
                           "reward_mean", "zero_variance_frac" (per step), "reward_errors",
                           "snapshots": [{"t", "step",
                           "completions", "file"}], "snapshot_seconds" (off the clock),
                           "train_cpu_seconds", "config" (TRL's effective settings)}
and prints `key value` lines: trl_steps, trl_train_seconds, trl_completions_per_s, trl_s_per_step.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Before transformers/datasets are imported: nothing may come from the HF hub, and the tokenizers' own
# thread pool would compete with torch's `threads`.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

# key -> accepted JSON types (bool is excluded separately: it is an int in Python).
SPEC_KEYS: dict[str, tuple[type, ...]] = {
    "model_path": (str,),
    "prompts": (list,),
    "seed": (int,),
    "seconds": (int, float),
    "max_steps": (int,),
    "snapshot_every_s": (int, float),
    "lr": (int, float),
    "batch_prompts": (int,),
    "group_size": (int,),
    "max_new_tokens": (int,),
    "temperature": (int, float),
    "grad_clip": (int, float),
    "beta": (int, float),
    "threads": (int,),
    "out_dir": (str,),
}
OPTIONAL_KEYS: dict[str, tuple[type, ...]] = {
    "reward_fn": (str,),
    "snapshot_steps": (list,),
    # read where the trainer is built (epsilon, epsilon_high, num_iterations); before they were listed here
    # the harness logged them as "ignoring unknown spec keys" although they were used
    "eps_clip": (int, float),
    "eps_clip_higher": (int, float, type(None)),
    "ppo_epochs": (int,),
}


class SpecError(ValueError):
    """The spec file is unusable; the message names the key and what to fix."""


def load_spec(path: Path) -> dict[str, Any]:
    """Read and check the spec; raises SpecError with a message that says what to fix."""
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise SpecError(f"spec file {path} does not exist") from e
    except json.JSONDecodeError as e:
        raise SpecError(f"spec file {path} is not valid JSON: {e}") from e
    if not isinstance(spec, dict):
        raise SpecError("the spec must be a JSON object")
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing:
        raise SpecError(f"missing keys {missing}; every one of {list(SPEC_KEYS)} is required")
    unknown = sorted(set(spec) - set(SPEC_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        print(f"peer_trl: ignoring unknown spec keys {unknown}", file=sys.stderr)
    for key, types in {**SPEC_KEYS, **OPTIONAL_KEYS}.items():
        if key not in spec:
            continue
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise SpecError(f"{key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
    if "reward_fn" in spec and ":" not in spec["reward_fn"]:
        raise SpecError(f"reward_fn must look like 'pkg.module:function', got {spec['reward_fn']!r}")
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in spec.get("snapshot_steps", [])
    ):
        raise SpecError(f"snapshot_steps must be a list of positive ints, got {spec['snapshot_steps']!r}")
    for key in ("seconds", "snapshot_every_s", "lr", "temperature"):
        if not spec[key] > 0:
            raise SpecError(f"{key} must be > 0, got {spec[key]}")
    for key in ("max_steps", "batch_prompts", "max_new_tokens", "threads"):
        if spec[key] < 1:
            raise SpecError(f"{key} must be >= 1, got {spec[key]}")
    for key in ("grad_clip", "beta"):
        if spec[key] < 0:
            raise SpecError(f"{key} must be >= 0 (0 = off), got {spec[key]}")
    if spec["group_size"] < 2:  # GRPO's advantage needs a group; TRL refuses num_generations < 2
        raise SpecError(f"group_size must be >= 2, got {spec['group_size']}")
    if not spec["prompts"]:
        raise SpecError("prompts is empty")
    for i, p in enumerate(spec["prompts"]):
        if not (
            isinstance(p, dict)
            and isinstance(p.get("messages"), list)
            and p["messages"]
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in p["messages"])
            and isinstance(p.get("answer"), str)
            and isinstance(p.get("data", {}), dict)
        ):
            raise SpecError(
                f"prompts[{i}] must be {{'messages': [{{'role': ..., 'content': ...}}, ...], 'answer': str, "
                f"'data': {{...}} (optional)}}, got {str(p)[:200]}"
            )
    model_path = Path(spec["model_path"])
    if not (model_path / "config.json").is_file():
        raise SpecError(f"model_path {model_path} is not a save_pretrained directory (no config.json)")
    out_dir = Path(spec["out_dir"])
    if out_dir.exists() and (any(out_dir.glob("snap-*.safetensors")) or (out_dir / "curve.json").exists()):
        raise SpecError(f"out_dir {out_dir} already holds results; give an empty or new directory")
    return spec


def cyclic_rows(prompts: list[dict[str, Any]], batch_prompts: int) -> list[dict[str, Any]]:
    """The prompt list tiled to a multiple of batch_prompts, in TRL's conversational format.

    TRL's RepeatSampler drops an epoch's incomplete last batch and restarts at row 0, so a length that is
    a multiple of batch_prompts makes epoch after epoch read as one endless cycle through `prompts`.
    """
    n = len(prompts)
    length = n * batch_prompts // math.gcd(n, batch_prompts)
    return [{"prompt": prompts[i % n]["messages"], "answer": prompts[i % n]["answer"]} for i in range(length)]


def exact_match(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """The default reward: 1.0 if the stripped completion is the stripped answer."""
    del prompt, data
    return 1.0 if completion.strip() == answer.strip() else 0.0


def import_reward(name: str | None) -> Callable[..., float]:
    """The function named ``"pkg.module:function"`` (``exact_match`` for None)."""
    if name is None:
        return exact_match
    module, _, attr = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise SystemExit(f"peer_trl: reward_fn {name!r} is not callable")
    return target  # type: ignore[no-any-return]


def last_user_message(messages: list[dict[str, Any]]) -> str:
    """What a reward sees as ``prompt`` (rollflow's contract)."""
    return next((str(m["content"]) for m in reversed(messages) if m.get("role") == "user"), "")


@dataclass
class RewardLog:
    """The task's reward plus per-step statistics.

    With steps_per_generation=1 and num_iterations=1, TRL scores exactly one generation batch per
    optimizer step, so one reward call = one step. It also checks TRL's order against the spec's.
    """

    prompts: list[dict[str, Any]]
    batch_prompts: int
    group_size: int
    reward_fn: Callable[..., float] = exact_match
    reward_mean: list[float] = field(default_factory=list)
    zero_variance_frac: list[float] = field(default_factory=list)
    completions: int = 0
    errors: int = 0  # rewards that raised or returned a non-number (scored 0)

    def score(self, prompt: dict[str, Any], completion: str) -> float:
        """``reward_fn`` as rollflow calls it; 0.0 (counted) when it raises or returns a bad value."""
        try:
            value = self.reward_fn(
                last_user_message(prompt["messages"]), completion, prompt["answer"], **prompt.get("data", {})
            )
        except Exception as e:  # noqa: BLE001 - a reward that raises scores 0, as in rollflow's runner
            self.errors += 1
            if self.errors == 1:
                print(f"peer_trl: the reward raised {e!r}; scoring 0", file=sys.stderr)
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.errors += 1
            return 0.0
        return float(value)

    def __call__(
        self, prompts: list[Any], completions: list[Any], answer: list[str], **_: Any
    ) -> list[float]:
        g = self.group_size
        expected_rows = len(self.reward_mean) * self.batch_prompts  # first row of this step in the cycle
        wanted = []
        for j in range(len(prompts) // g):
            want = self.prompts[(expected_rows + j) % len(self.prompts)]
            if any(p != want["messages"] for p in prompts[j * g : (j + 1) * g]) or any(
                a != want["answer"] for a in answer[j * g : (j + 1) * g]
            ):
                raise RuntimeError(
                    f"TRL fed prompts out of order at step {len(self.reward_mean)}, group {j}: expected "
                    f"{want['messages']}, got {prompts[j * g]}; check shuffle_dataset / the sampler"
                )
            wanted += [want] * g
        rewards = [self.score(want, completion_text(c)) for want, c in zip(wanted, completions, strict=True)]
        groups = [rewards[j : j + g] for j in range(0, len(rewards), g)]
        self.reward_mean.append(sum(rewards) / len(rewards))
        self.zero_variance_frac.append(sum(len(set(gr)) == 1 for gr in groups) / len(groups))
        self.completions += len(rewards)
        return rewards


def completion_text(completion: Any) -> str:
    """The assistant text of one completion.

    For conversational prompts TRL passes [{"role": "assistant", "content": text}], where text was decoded
    with skip_special_tokens=True (so the closing eos is gone); for plain prompts, the string itself.
    """
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if m.get("role") == "assistant")


@dataclass
class Snapshot:
    t: float
    step: int
    completions: int
    weights: dict[str, torch.Tensor]


class ClockCallback(TrainerCallback):
    """Keeps the training clock, takes in-memory snapshots off the clock, stops at `seconds`."""

    def __init__(
        self,
        seconds: float,
        snapshot_every_s: float,
        rewards: RewardLog,
        snapshot_steps: tuple[int, ...] = (),
    ) -> None:
        self.seconds = seconds
        self.every = snapshot_every_s
        self.snapshot_steps = frozenset(snapshot_steps)
        self.rewards = rewards
        self.snapshots: list[Snapshot] = []
        self.step_seconds: list[float] = []
        self.t0 = 0.0
        self.cpu0 = 0.0
        self.excluded = 0.0  # seconds spent snapshotting, taken off the clock
        self.excluded_cpu = 0.0
        self.cpu = 0.0  # process CPU seconds at the last step end, on the same terms as the clock
        self.last = 0.0  # clock at the previous step end
        self.next_snap = snapshot_every_s

    def clock(self) -> float:
        return time.perf_counter() - self.t0 - self.excluded

    def snapshot(self, model: torch.nn.Module, t: float, step: int) -> None:
        # Cloning breaks the sharing of tied weights: both keys are saved, which load_state_dict accepts.
        weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        self.snapshots.append(Snapshot(t, step, self.rewards.completions, weights))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.snapshot(model, 0.0, 0)
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        now = self.clock()
        self.step_seconds.append(now - self.last)
        self.last = now
        self.cpu = time.process_time() - self.cpu0 - self.excluded_cpu
        if now >= self.next_snap or state.global_step in self.snapshot_steps:
            started, started_cpu = time.perf_counter(), time.process_time()
            self.snapshot(model, now, state.global_step)
            self.next_snap = max(self.next_snap, (math.floor(now / self.every) + 1) * self.every)
            self.excluded += time.perf_counter() - started
            self.excluded_cpu += time.process_time() - started_cpu
        if now >= self.seconds:
            control.should_training_stop = True


def run(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec["threads"])
    transformers.set_seed(spec["seed"])  # python random, numpy, torch
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)

    model_path = spec["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if tokenizer.chat_template is None or tokenizer.eos_token_id is None:
        raise SystemExit(f"peer_trl: the tokenizer in {model_path} needs a chat template and an eos token")

    rewards = RewardLog(
        spec["prompts"], spec["batch_prompts"], spec["group_size"], import_reward(spec.get("reward_fn"))
    )
    rewards.__name__ = "reward"  # TRL names reward columns after __name__
    clock = ClockCallback(
        float(spec["seconds"]),
        float(spec["snapshot_every_s"]),
        rewards,
        tuple(spec.get("snapshot_steps", ())),
    )
    config = GRPOConfig(
        output_dir=str(out_dir),  # required by TrainingArguments; nothing is saved there
        use_cpu=True,
        bf16=False,
        # transformers 5.23 renamed gradient_checkpointing; setting the new name keeps TRL's default (True) out.
        activation_checkpointing=False,
        gradient_checkpointing=False,
        seed=spec["seed"],
        data_seed=spec["seed"],
        shuffle_dataset=False,  # TRL shuffles prompts by default; the spec fixes the order
        per_device_train_batch_size=spec["batch_prompts"] * spec["group_size"],
        num_generations=spec["group_size"],
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        max_steps=spec["max_steps"],
        beta=float(spec["beta"]),
        max_completion_length=spec["max_new_tokens"],
        temperature=float(spec["temperature"]),
        top_k=0,  # plain sampling, as rollflow
        top_p=1.0,
        learning_rate=float(spec["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=float(spec["grad_clip"]),
        # The same clip and batch reuse as rollflow's train.eps_clip(_higher) and train.ppo_epochs.
        epsilon=float(spec.get("eps_clip", 0.2)),
        epsilon_high=float(spec.get("eps_clip_higher") or spec.get("eps_clip", 0.2)),
        num_iterations=int(spec.get("ppo_epochs", 1)),
        optim="adamw_torch",  # plain torch.optim.AdamW (weight_decay 0, betas 0.9/0.999, eps 1e-8), as rollflow
        weight_decay=0.0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",  # the curve comes from our callback; TRL's log lines would only clutter stdout
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[rewards],
        args=config,
        train_dataset=Dataset.from_list(cyclic_rows(spec["prompts"], spec["batch_prompts"])),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    # Trainer prints its end-of-train metrics dict; stdout is reserved for our `key value` lines.
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()

    steps = len(clock.step_seconds)
    train_seconds = clock.last
    if clock.snapshots[-1].step != steps:  # the final weights, unless the last step end already took them
        clock.snapshot(trainer.model, train_seconds, steps)
    snapshots = []
    for i, snap in enumerate(clock.snapshots):
        name = f"snap-{i:03d}.safetensors"
        save_file(snap.weights, str(out_dir / name), metadata={"t": f"{snap.t:.3f}", "step": str(snap.step)})
        snapshots.append({"t": snap.t, "step": snap.step, "completions": snap.completions, "file": name})

    curve = {
        "system": "trl",
        "trl_version": trl.__version__,
        "seed": spec["seed"],
        "steps": steps,
        "train_seconds": train_seconds,
        "completions": rewards.completions,
        "completions_per_s": rewards.completions / train_seconds if train_seconds > 0 else 0.0,
        "step_seconds": clock.step_seconds,
        "reward_mean": rewards.reward_mean,
        "zero_variance_frac": rewards.zero_variance_frac,
        "reward_errors": rewards.errors,
        "snapshots": snapshots,
        "snapshot_seconds": clock.excluded,
        # CPU seconds of this process over the clock (all threads): on a shared machine, wall time varies
        # with other jobs' load, and this says how much of it was this run's own work.
        "train_cpu_seconds": clock.cpu,
        # The effective settings, read back from TRL (its defaults included), so a run documents itself.
        "config": {
            "loss_type": config.loss_type,
            "scale_rewards": config.scale_rewards,
            "epsilon": config.epsilon,
            "beta": config.beta,
            "num_iterations": config.num_iterations,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "num_generations": config.num_generations,
            "max_completion_length": config.max_completion_length,
            "temperature": config.temperature,
            "top_k": config.top_k,
            "top_p": config.top_p,
            "learning_rate": config.learning_rate,
            "max_grad_norm": config.max_grad_norm,
            "optim": str(config.optim),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    (out_dir / "curve.json").write_text(json.dumps(curve, indent=1))
    return curve


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: .venv-trl/bin/python bench/peer_trl.py SPEC.json")
    try:
        spec = load_spec(Path(argv[1]))
    except SpecError as e:
        raise SystemExit(f"peer_trl: bad spec {argv[1]}: {e}") from e
    curve = run(spec)
    steps = curve["steps"]
    print(f"trl_steps {steps}")
    print(f"trl_train_seconds {curve['train_seconds']:.3f}")
    print(f"trl_completions_per_s {curve['completions_per_s']:.1f}")
    print(f"trl_s_per_step {curve['train_seconds'] / steps if steps else float('nan'):.4f}")


if __name__ == "__main__":
    main(sys.argv)
