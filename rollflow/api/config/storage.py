"""``storage``: where trajectories and checkpoints live, and how long checkpoints are kept.

What it is not: the storage code (``storage/``); only the fields and their single-section checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollflow.api.config.fields import check, help_


@dataclass
class StorageConfig:
    root: str = field(
        default="runs/storage",
        metadata=help_(
            "Where trajectories and checkpoints live: a local path, file://..., or s3://bucket/prefix. "
            "Everything goes under {root}/{experiment}/{trial}/."
        ),
    )
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata=help_(
            "fsspec storage options, e.g. {endpoint_url: http://127.0.0.1:9000, key: ..., secret: ...}. "
            "Prefer the AWS_* environment variables or a Prefect Secret block for credentials; "
            "secret values are redacted from logs and MLflow params.",
            secret_keys=("key", "secret", "token", "password", "aws_secret_access_key", "session_token"),
        ),
    )
    keep_checkpoints: int = field(
        default=3,
        metadata=help_(
            "Checkpoint GC keeps this many newest versions, and never one a live server still serves."
        ),
    )
    ack_ttl_s: float | None = field(
        default=300.0,
        metadata=help_(
            "A server's checkpoint ack counts for checkpoint GC only this many seconds after it was "
            "written; watchers re-ack what their servers serve every ack_ttl_s / 4. So a dead server (or "
            "one from an earlier run of the trial, which had other ports) stops holding old checkpoints "
            "after ack_ttl_s. Keep it above the longest checkpoint download + load. null = acks never "
            "expire (GC then stops for good at the oldest version any server ever served last)."
        ),
    )
    local_cache: str = field(
        default="runs/cache",
        metadata=help_("Local directory where inference workers cache verified checkpoints."),
    )

    def __post_init__(self) -> None:
        check(self.root != "", "storage.root", "must not be empty; use a path or s3://bucket/prefix")
        check(self.keep_checkpoints >= 1, "storage.keep_checkpoints", "must be >= 1")
        if self.ack_ttl_s is not None:
            check(
                self.ack_ttl_s > 0,
                "storage.ack_ttl_s",
                "must be > 0 seconds, or null for acks that never expire",
            )
