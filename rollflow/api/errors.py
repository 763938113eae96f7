"""Named exceptions of the rollflow core.

What it is: the one place where rollflow's own error types live, so callers can catch them by name.
Storage errors (SchemaMismatchError, CommitConflictError, CheckpointIntegrityError, ...) live in
``storage.errors`` because storage is the bottom layer.
What it is not: no error handling policy, no logging.
"""

from __future__ import annotations

from typing import Any


class RollflowError(Exception):
    """Base class of rollflow core errors."""


class ConfigError(RollflowError, ValueError):
    """A config key is unknown, has the wrong type or an impossible value.

    The message names the dotted key and says how to fix it.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key '{key}': {message}")


class WorkflowImportError(RollflowError, ImportError):
    """An import string 'pkg.module:Name' could not be resolved."""


class DatasetRowError(RollflowError, ValueError):
    """A dataset row is malformed; the message names the row index and field."""


class DatasetFileError(RollflowError, ValueError):
    """A dataset file cannot be read (not UTF-8, empty, not the format it claims); names the file and fix."""


class BaseModelMismatchError(RollflowError, ValueError):
    """A LoRA adapter meets a base model other than the one it was trained on (weights digest differs)."""


class InferenceError(RollflowError):
    """An inference request failed on every server it was tried on.

    A control call a server answered with an HTTP error carries the answer: ``status`` (the HTTP code) and
    ``reply`` (its parsed JSON body, or text); both are None when no server answered.
    """

    status: int | None = None
    reply: Any = None


class ServerUnavailableError(InferenceError):
    """No inference server answered (dead, unreachable or unhealthy)."""


class InvalidRequestError(InferenceError, ValueError):
    """A request breaks the SGLang protocol (HTTP 4xx); the message names the field and what is wrong."""


class WeightUpdateError(InferenceError):
    """A server refused ``/update_weights_from_disk``; it keeps serving its old weights. Quotes the reply."""


class ServerStartupError(InferenceError):
    """A launched inference server exited or never became healthy; the message ends with its log tail."""


class RewardInfrastructureError(RollflowError):
    """No reward worker could score a sample (it died or never started, retries included).

    Not a judgement of the completion: the workflow drops the sample's group and counts it instead of
    training on a made-up reward of 0.
    """


class ServerLostError(ServerUnavailableError):
    """A launched inference server died and was not brought back (restarts used up, or it would not start).

    The server is dropped from routing and from weight updates; the message names its address, exit
    code and log. Raised by the rollout loop only when no server is left.
    """


class RolloutFailureError(RollflowError):
    """The rollout loop stopped because too many episodes raised; quotes the first traceback."""


class RewardFunctionError(RollflowError):
    """The reward function raised on every one of its first calls: it is broken, not unlucky.

    The message quotes the first error and says how many calls raised."""


class NotResumableError(RollflowError):
    """A run whose failure would only repeat on a resume (``rollflow.trial.auto_resume``); says why."""


class CorruptRecordError(RollflowError):
    """A trial's record file exists but cannot be read; it is never rewritten. The message names the file
    and what to do."""


class TrainerError(RollflowError):
    """The trainer cannot continue (no data within the timeout, inconsistent resume state, ...)."""


class LoopFailedError(RollflowError):
    """One of a run's long-lived loops (``rollout-loop``, ``train-loop``, ``eval-loop``) failed.

    ``loop`` names it; the message says why (the loop's own error, chained as ``__cause__``) and what the
    other loops did about it (the trainer stops after its step and writes a resume point).
    """

    def __init__(self, loop: str, message: str) -> None:
        self.loop = loop
        super().__init__(f"{loop} failed: {message}")


class AgentRequestError(RollflowError, ValueError):
    """An OpenAI-compatible call to an agent endpoint that rollflow cannot serve (HTTP 400).

    ``param`` names the request field, ``code`` is a stable machine-readable name; the message says
    what to send instead. Nothing is recorded for the call; the episode goes on.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        self.param = param
        self.code = code
        super().__init__(message)


class EpisodeLimitError(RollflowError):
    """An agent call would break one of its episode's limits (``max_turns``, the token budget, staleness).

    ``reason`` is the counted drop reason (``max_turns``, ``token_budget``, ``stale``). The call is
    refused and the whole episode is dropped, never trained.
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class ViewerInputError(RollflowError, ValueError):
    """A trajectory-viewer request parameter that cannot be used (a bad version range, a non-numeric reward)."""


class TrialExistsError(ConfigError):
    """A run named a trial that already holds data without asking to resume it."""


class NothingToResumeError(ConfigError):
    """``resume=True`` named a trial that holds no data."""


class ResumeOverrideError(ConfigError):
    """An override given on resume would contradict what the trial already recorded."""


class CommandError(RollflowError):
    """A ``rollflow`` command line that cannot work as given; the message says what to type instead."""
