"""No capability probes on our own objects: every ``getattr``/``hasattr`` with a literal name is listed here.

A ``getattr(obj, "x", None)`` on one of our objects is a missing line in a Protocol, or an attribute that
``__init__`` should have built: declare it and read it plainly (docs/architecture.md, "Layers").
What is left probes objects we do not own (third-party libraries, the standard library, a user's
callable or dataset), where no declared interface says what is there. Each is allowed below by its
receiver and name (``receiver.name``, as written in the call), with why; the check reads every
module's syntax tree (nothing is imported), so it runs in a few milliseconds.

What it is not: a ban on ``getattr(obj, name)`` with a computed name (dataclass fields, ``__getattr__``
delegation, an import string's attribute): those read what a declared structure already names.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollflow", "storage", "infra", "tasks", "flows")

# receiver.name -> why it cannot be declared (the object is not ours)
ALLOWED = {
    # the standard library
    "exc.name": "an ImportError raised by an import string: ``name`` is only set by the import system",
    "tp.__name__": "a typing construct (Optional, Literal, ...) in the config docs: not every one has a name",
    "origin.__name__": "typing.get_origin of a config annotation: a class or a special form",
    "os.sysconf": "os.sysconf is POSIX-only (the CPU meter's clock ticks)",
    "stream.isatty": "a console stream handed over by Prefect or the terminal: any file-like object",
    "signal.SIGUSR1": "signal.SIGUSR1 does not exist on Windows",
    "args.config": "an argparse Namespace: each subcommand defines its own options",
    "args.overrides": "an argparse Namespace: each subcommand defines its own options",
    # logging records carry Prefect's run id only inside a flow run
    "record.flow_run_id": "a logging.LogRecord: Prefect adds flow_run_id only to records of a flow run",
    # a user's callable, agent or dataset
    "fn.__name__": "a user's reward callable: a functools.partial or a callable object has no __name__",
    "fn.__module__": "a user's reward callable: a callable object may have no __module__",
    "fn.__qualname__": "a user's reward callable: a callable object may have no __qualname__",
    "self.agent.__call__": "a user's agent: a function or an object with an async __call__",
    "data.to_list": "a user's dataset: a datasets.Dataset, a list of dicts or a dict of columns",
    "data.column_names": "a user's dataset: a datasets.Dataset, a list of dicts or a dict of columns",
    "dataset.keys": "a user's dataset: a datasets.DatasetDict has splits",
    "dataset.column_names": "a user's dataset: a datasets.DatasetDict has splits",
    "dataset.to_list": "a user's dataset: a datasets.DatasetDict has splits",
    # transformers and torch
    "tokenizer.chat_template": "a transformers tokenizer: chat_template is None or absent on some",
    "tokenizer.all_special_ids": "a transformers tokenizer (or a test's tokenizer) may not list special ids",
    "model.generation_config": "a transformers model: only generative models have a generation_config",
    "model._no_split_modules": "a transformers model: FSDP wraps the blocks it names, when it names any",
    "cfg.max_position_embeddings": "a transformers config: not every architecture has a context length",
    "src.eos_token_id": "a transformers generation config, model config or tokenizer: any may lack it",
    "out.logits": "a transformers model output, or a plain tuple from a compiled or wrapped model",
    "total.full_tensor": "a torch tensor, or a DTensor under FSDP2",
    # aiohttp, s3fs, botocore, Prefect
    "site._server.sockets": "aiohttp's TCPSite: the bound port when port=0 (no public accessor)",
    "stamp.timestamp": "an fsspec file's modification time: a float on posix, a datetime on s3fs",
    "cur.response": "an exception chain from s3fs/botocore: only a ClientError carries the response",
    "fut.state": "a Prefect future: a PrefectFuture has ``state``, a concurrent future does not",
}


def probes_in(source: str) -> list[tuple[int, str]]:
    """``(line, receiver.name)`` of every ``getattr``/``hasattr`` call with a literal name in ``source``."""
    return sorted(
        (node.lineno, f"{ast.unparse(node.args[0])}.{node.args[1].value}")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def probes(package: str) -> list[tuple[str, str]]:
    """``(path:line, receiver.name)`` of every probe in ``package``."""
    return [
        (f"{path.relative_to(ROOT).as_posix()}:{line}", name)
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, name in probes_in(path.read_text())
    ]


def test_no_capability_probes_on_our_own_objects() -> None:
    found = [p for pkg in PACKAGES for p in probes(pkg)]
    assert [f"{where} probes {name}" for where, name in found if name not in ALLOWED] == []
    # declare it in the Protocol (rollflow/api/) or build it in __init__, and read it plainly
    assert sorted(set(ALLOWED) - {name for _, name in found}) == []  # a stale entry: drop it


def test_the_probe_finder_sees_getattr_and_hasattr() -> None:
    source = 'a = getattr(x.y, "z", None)\nb = hasattr(os, "sysconf")\nc = getattr(x, name)\nd = x.z\n'
    assert probes_in(source) == [(1, "x.y.z"), (2, "os.sysconf")]
