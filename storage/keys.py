"""The key layout of a trial, in one place (DESIGN.md, section "Storage").

Every key is relative to the trial root `{root}/{experiment}/{trial}/` held by `storage.fs.Storage`.
This module is pure functions and constants: it does NO I/O and knows nothing about filesystems.

```
trajectories/data/{writer}-{uid}.parquet                  immutable shard, one put
trajectories/commits/v{head:06d}/{writer}-{seq:08d}.json  commit record (partition = min head version)
trajectories/quarantine/{commit_id}.json                  record of a shard that failed verification
trajectories/credits/v{P:06d}/{commit_id}.json           groups of a commit dropped as stale (storage.credits)
prompts/claims/{b // 1000:06d}/{b:010d}.json             prompt block b claimed by a worker (storage.prompt_claims)
prompts/takeovers/{b:010d}-{gen:03d}.json                a dead worker's block adopted (storage.prompt_claims)
checkpoints/v{N:06d}/...                                  HF save_pretrained dir
checkpoints/v{N:06d}/COMMIT.json                          written last: the checkpoint exists iff this does
checkpoints/v{N:06d}/acks/{server}.json                   a server serves N
checkpoints/LATEST                                        {"version": N, "path": ...}
trainer/state-{step:08d}.json, trainer/state-{step:08d}/  resume point (+ model/optimizer safetensors)
trainer/consumed/step-{step:08d}.json                     the group ids step `step` trained on (audit trail)
trainer/DONE.json                                         the trainer finished
FINALIZED.json                                            the trial is whole (written last; storage.finalization)
rollout/state-{name}.json                                 a rollout worker's state and heartbeat (storage.worker_state)
rollout/partials/{writer_id}.json                         episodes in flight at a graceful stop (storage.partial_records)
orchestration/auto-resumes.json                           automatic resumes of the trial (rollflow.trial.auto_resume)
eval/v{N:06d}.json                                        evaluation of version N
record/config.json                                        the config the trial runs with (rollflow.trial.record)
record/base-split.json                                    what the starting policy solved (rollflow.trial.base_split)
record/warm-start.json                                    where the first steps' data came from (warm_start_reuse)
```
"""

from __future__ import annotations

import re

TRAJECTORIES = "trajectories"
SHARD_DIR = "trajectories/data"
COMMIT_DIR = "trajectories/commits"
QUARANTINE_DIR = "trajectories/quarantine"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_COMMIT_NAME = "COMMIT.json"
LATEST_KEY = "checkpoints/LATEST"
TRAINER_DIR = "trainer"
TRAINER_DONE_KEY = "trainer/DONE.json"
CONSUMED_DIR = "trainer/consumed"
FINALIZED_KEY = "FINALIZED.json"
ROLLOUT_DIR = "rollout"
CLAIM_DIR = "prompts/claims"
TAKEOVER_DIR = "prompts/takeovers"
CLAIMS_PER_DIR = 1000
PARTIALS_DIR = "rollout/partials"
AUTO_RESUMES_KEY = "orchestration/auto-resumes.json"
EVAL_DIR = "eval"
RECORD_DIR = "record"
CONFIG_RECORD_KEY = "record/config.json"
BASE_SPLIT_KEY = "record/base-split.json"
WARM_START_KEY = "record/warm-start.json"
_STATE_PREFIX = "state-"

# Names that go into keys: letters, digits, '_', '.', '-'; no leading '.' (hidden / temp files).
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_VERSION_DIR_RE = re.compile(r"^v(\d{6,})$")


def check_name(name: str, what: str = "name") -> str:
    """Return `name` if it is safe as one key component, else raise ValueError saying what is allowed."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ValueError(
            f"invalid {what} {name!r}: use 1-128 characters from [A-Za-z0-9_.-], not starting with '.' or '-'"
        )
    return name


def _check_version(v: int, what: str = "version") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be an int >= 0, got {v!r}")
    return v


def version_dir_name(v: int) -> str:
    """`v000042` for 42."""
    return f"v{_check_version(v):06d}"


def parse_version_dir(name: str) -> int | None:
    """Inverse of `version_dir_name` on the last key component; None if `name` is not one."""
    m = _VERSION_DIR_RE.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


# --- trajectories -----------------------------------------------------------------------------------------


def shard_key(writer: str, uid: str) -> str:
    """`trajectories/data/{writer}-{uid}.parquet`."""
    return f"{SHARD_DIR}/{check_name(writer, 'writer')}-{check_name(uid, 'uid')}.parquet"


def commit_id(writer: str, seq: int) -> str:
    """`{writer}-{seq:08d}`: unique per commit because `writer` is unique per ShardWriter instance."""
    return f"{check_name(writer, 'writer')}-{_check_version(seq, 'seq'):08d}"


def commit_partition(head_version: int) -> str:
    """`trajectories/commits/v{head:06d}`."""
    return f"{COMMIT_DIR}/{version_dir_name(head_version)}"


def commit_key(head_version: int, writer: str, seq: int) -> str:
    """`trajectories/commits/v{head:06d}/{writer}-{seq:08d}.json`."""
    return f"{commit_partition(head_version)}/{commit_id(writer, seq)}.json"


def quarantine_key(commit_id: str) -> str:
    """`trajectories/quarantine/{commit_id}.json`."""
    return f"{QUARANTINE_DIR}/{check_name(commit_id, 'commit_id')}.json"


# --- checkpoints ------------------------------------------------------------------------------------------


def checkpoint_dir(v: int) -> str:
    """`checkpoints/v{v:06d}`."""
    return f"{CHECKPOINT_DIR}/{version_dir_name(v)}"


def checkpoint_commit_key(v: int) -> str:
    """`checkpoints/v{v:06d}/COMMIT.json`."""
    return f"{checkpoint_dir(v)}/{CHECKPOINT_COMMIT_NAME}"


def ack_dir(v: int) -> str:
    """`checkpoints/v{v:06d}/acks`."""
    return f"{checkpoint_dir(v)}/acks"


def ack_key(v: int, server_id: str) -> str:
    """`checkpoints/v{v:06d}/acks/{server}.json`."""
    return f"{ack_dir(v)}/{check_name(server_id, 'server_id')}.json"


# --- trainer / rollout / eval -----------------------------------------------------------------------------


def trainer_state_key(step: int) -> str:
    """`trainer/state-{step:08d}.json`: consumed commits, version, RNG, data cursor."""
    return f"{trainer_state_dir(step)}.json"


def trainer_state_dir(step: int) -> str:
    """`trainer/state-{step:08d}`: model / optimizer blobs (safetensors) beside the JSON."""
    return f"{TRAINER_DIR}/{_STATE_PREFIX}{_check_version(step, 'step'):08d}"


def parse_trainer_state_key(key: str) -> int | None:
    """Inverse of `trainer_state_key` on a key as listed under `trainer/`; None if `key` is not one."""
    if key.count("/") != 1 or not key.endswith(".json"):
        return None
    return parse_trainer_state_dir(key.removesuffix(".json"))


def parse_trainer_state_dir(key: str) -> int | None:
    """Inverse of `trainer_state_dir` on the last key component (`state-{step}`); None if it is not one."""
    name = key.rsplit("/", 1)[-1]
    digits = name[len(_STATE_PREFIX) :]
    return int(digits) if name.startswith(_STATE_PREFIX) and digits.isdigit() else None


def consumed_key(step: int) -> str:
    """`trainer/consumed/step-{step:08d}.json`: the groups that step `step` trained on."""
    return f"{CONSUMED_DIR}/step-{_check_version(step, 'step'):08d}.json"


def parse_consumed_key(key: str) -> int | None:
    """Inverse of `consumed_key` on the last key component; None if `key` is not one."""
    digits = key.rsplit("-", 1)[-1].removesuffix(".json")
    return int(digits) if digits.isdigit() else None


def rollout_state_key(name: str) -> str:
    """`rollout/state-{name}.json`."""
    return f"{ROLLOUT_DIR}/state-{check_name(name, 'name')}.json"


def is_rollout_state_key(key: str) -> bool:
    """Is `key` a rollout worker's state file (`rollout/state-{name}.json`, as listed under `rollout/`)?"""
    name = key.rsplit("/", 1)[-1]
    return name.startswith("state-") and name.endswith(".json")


# --- prompt claims ----------------------------------------------------------------------------------------


def claim_key(block: int) -> str:
    """`prompts/claims/{block // 1000:06d}/{block:010d}.json`."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise ValueError(f"block must be an int >= 0, got {block!r}")
    return f"{CLAIM_DIR}/{block // CLAIMS_PER_DIR:06d}/{block:010d}.json"


def takeover_key(block: int, gen: int) -> str:
    """`prompts/takeovers/{block:010d}-{gen:03d}.json`."""
    if block < 0 or gen < 1:
        raise ValueError(f"takeover needs block >= 0 and gen >= 1, got {block}, {gen}")
    return f"{TAKEOVER_DIR}/{block:010d}-{gen:03d}.json"


def eval_key(version: int) -> str:
    """`eval/v{v:06d}.json`."""
    return f"{EVAL_DIR}/{version_dir_name(version)}.json"


def partials_key(writer_id: str) -> str:
    """The partial episodes one rollout process committed at its graceful stop (one put)."""
    return f"{PARTIALS_DIR}/{check_name(writer_id, 'writer id')}.json"
