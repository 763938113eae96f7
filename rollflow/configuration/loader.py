"""Build an ``ExperimentConfig`` from defaults, a YAML file and dotted overrides; flatten and document it.

What it is: the merge ``defaults <- YAML <- CLI overrides (train.lr=1e-5)``, strict type checking with
errors that name the key and the fix (a float must be finite: ``.inf`` and ``.nan`` are refused; the
tree's depth and alias expansion are bounded, ``rollflow.configuration.tree_limits``), a secret-free flat view for MLflow params, and the generator of
docs/configuration.md (``python -m rollflow.configuration.loader --docs``).
What it is not: the fields themselves (``rollflow.api.config``) or any storage/Prefect access.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from rollflow.api.config import INFERENCE_API_KEY_ENV, ExperimentConfig
from rollflow.api.errors import ConfigError
from rollflow.api.net import is_loopback_host
from rollflow.configuration.layout import resolve_layout
from rollflow.configuration.redact import REDACTED, find_secrets, redact_tree
from rollflow.configuration.tree_limits import check_tree

T = TypeVar("T")


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; convert only lossless cases (int -> float)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(key, f"must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {value!r}")
        (item_tp,) = get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return dict(value)
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, prefix=key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '1e-5' (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(key, f"expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            out = float(value)
        except OverflowError:  # an int past the float range (10**400)
            raise ConfigError(
                key, "expected a finite number, got an integer beyond the float range"
            ) from None
        if not math.isfinite(out):  # YAML's .inf / .nan
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return out
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported annotation {tp!r}")  # a bug in config.py, not user input


def _unknown_key_error(cls: type, name: str, prefix: str) -> ConfigError:
    known = sorted(_fields(cls))
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known keys: {', '.join(known)}"
    return ConfigError(f"{prefix}{name}", f"unknown key; {hint}")


def _build(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    fields = _fields(cls)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name not in fields:
            raise _unknown_key_error(cls, str(name), prefix)
        kwargs[name] = _coerce(value, hints[name], prefix + name)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # pragma: no cover - defensive: dataclass signature mismatch
        raise ConfigError(prefix.rstrip(".") or "<root>", str(exc)) from exc


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """``'train.lr=1e-5'`` -> (['train', 'lr'], 1e-05). Values are parsed as YAML scalars/lists."""
    if "=" not in item:
        raise ConfigError(item, "an override must look like 'section.key=value', e.g. train.lr=1e-5")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(part == "" for part in key.split(".")):
        raise ConfigError(key or item, "empty key in override; use 'section.key=value'")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"cannot parse value {raw!r}: {exc}") from exc
    except RecursionError:
        raise ConfigError(key, "the value nests too deeply; flatten it") from None
    check_tree(value, key)
    return key.split("."), value


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("<file>", f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("<file>", f"{p} is not valid YAML: {exc}") from exc
    except RecursionError:  # PyYAML composes recursively: thousands of nested levels
        raise ConfigError("<file>", f"{p} nests too deeply to be a config; flatten it") from None
    if not isinstance(data, dict):
        raise ConfigError("<file>", f"{p} must hold a mapping of sections, got {type(data).__name__}")
    check_tree(data, "<file>")
    return data


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    data: Mapping[str, Any] | None = None,
) -> ExperimentConfig:
    """Defaults <- YAML file (or ``data``) <- dotted overrides, validated."""
    tree: dict[str, Any] = {}
    if path is not None:
        tree = read_yaml(path)
    if data is not None:
        tree = _deep_merge(tree, data)
    for item in overrides:
        keys, value = parse_override(item)
        _set_path(tree, keys, value)
    check_tree(tree)  # data= and the merge too: depth and alias expansion bounded before anything copies
    cfg = _build(ExperimentConfig, tree)
    check_environment(cfg)
    return resolve_layout(cfg)  # n_servers / server_threads: auto, on this machine


def check_environment(cfg: ExperimentConfig, environ: Mapping[str, str] | None = None) -> None:
    """Checks that need this machine, run when a config is resolved (``load_config``), so a run fails
    at once instead of minutes in:

    * ``dataset.kind=reasoning_gym``: the generator and its parameters exist, and it can draw a row
      (``rollflow.data.reasoning_gym.check_config``: some need data files a wheel may not ship);
    * an absolute ``model.path`` must exist (unless ``model.bootstrap_tiny`` builds it); a relative
      one may be a hub name and is left to the loader;
    * launched servers (``inference.backend`` local or sglang) bound to a non-loopback
      ``inference.host`` need an API key (``inference.api_key`` or ``$ROLLFLOW_INFERENCE_API_KEY``):
      without one anybody who reaches the port can generate and load weights.

    Raises:
        ConfigError: naming the key and the fix.
    """
    env = os.environ if environ is None else environ
    if cfg.dataset.kind == "reasoning_gym":  # the generator, its parameters and its data files exist
        from rollflow.data.reasoning_gym import check_config

        check_config(cfg.dataset.reasoning_gym)
    model = cfg.model.path
    if os.path.isabs(model) and not cfg.model.bootstrap_tiny and not os.path.isdir(model):
        raise ConfigError(
            "model.path",
            f"{model!r} does not exist (or is not a directory); point it at a Hugging Face model "
            "directory, or set model.bootstrap_tiny=true to build the tiny model there",
        )
    inf = cfg.inference
    keyless = not (inf.api_key or env.get(INFERENCE_API_KEY_ENV))
    if inf.backend != "external" and not is_loopback_host(inf.host) and keyless:
        raise ConfigError(
            "inference.host",
            f"{inf.host!r} exposes the inference servers beyond this machine without an API key; "
            f"set ${INFERENCE_API_KEY_ENV} (or inference.api_key), or keep inference.host=127.0.0.1",
        )


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _is_secret_field(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("secret"))


def _secret_field_values(cfg: Any) -> set[str]:
    """The string values of fields marked ``secret`` (``inference.api_key``), anywhere in the tree."""
    found: set[str] = set()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            found |= _secret_field_values(value)
        elif _is_secret_field(f) and isinstance(value, str):
            found.add(value)
    return found


def _redacted(cfg: Any, known: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        secret_keys = {k.lower() for k in f.metadata.get("secret_keys", ())}
        if dataclasses.is_dataclass(value):
            out[f.name] = _redacted(value, known)
        elif _is_secret_field(f):
            out[f.name] = None if value is None else REDACTED
        elif isinstance(value, Mapping):
            masked = {k: REDACTED if str(k).lower() in secret_keys else v for k, v in value.items()}
            out[f.name] = redact_tree(masked, known)  # by key inside free-form mappings, and by value
        else:
            # A field name is not a credential hint (``max_new_tokens``); values still are: URLs with
            # userinfo, ``Bearer ...``, ``--api-key X`` in argument lists, secrets seen elsewhere.
            out[f.name] = redact_tree(value, known)
    return out


def _check_fields(cfg: Any, prefix: str = "") -> None:
    """``check_tree`` on every non-section field of ``cfg`` (a config built in code skips the loader)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _check_fields(value, f"{prefix}{f.name}.")
        else:
            check_tree(value, f"{prefix}{f.name}")


def redacted_dict(cfg: Any) -> dict[str, Any]:
    """``asdict`` with every credential masked as '***' (see ``rollflow.configuration.redact``): fields marked
    secret, secret-looking entries of mappings (``storage.options.key``, an ``Authorization`` header in
    ``rollout.workflow_kwargs``), URL userinfo (``endpoint_url``, ``dataset.path``, the MLflow URI),
    secret flags in argument lists (``--api-key`` in ``sglang.extra_args``), and each of those values
    wherever else it appears."""
    _check_fields(cfg)  # asdict below copies every alias: bound the expansion first
    known = _secret_field_values(cfg) | find_secrets(to_dict(cfg))
    return _redacted(cfg, frozenset(known))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'train': {'lr': 1}} -> {'train.lr': 1}``; lists are kept as values."""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def flat_params(cfg: ExperimentConfig) -> dict[str, str]:
    """Flattened, secret-free config for MLflow params (values stringified)."""
    return {k: str(v) for k, v in flatten(redacted_dict(cfg)).items()}


def to_yaml(cfg: ExperimentConfig, *, redact: bool = True) -> str:
    tree = redacted_dict(cfg) if redact else to_dict(cfg)
    return yaml.safe_dump(tree, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# docs/configuration.md
# ---------------------------------------------------------------------------------------------


def _default_repr(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _doc_section(cls: type, prefix: str, lines: list[str]) -> None:
    hints = _hints(cls)
    rows = []
    subsections = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            subsections.append((f, tp))
            continue
        help_text = f.metadata.get("help", "").replace("|", "\\|")
        type_text = _type_name(tp).replace("|", "\\|")
        rows.append(
            f"| `{prefix}{f.name}` | {type_text} | {_default_repr(f).replace('|', '/')} | {help_text} |"
        )
    if rows:
        title = prefix.rstrip(".") or "top level"
        lines += [f"## `{title}`", ""]
        doc = cls.__doc__ if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
        if doc:
            lines += [doc.strip(), ""]
        lines += ["| key | type | default | help |", "| --- | --- | --- | --- |", *rows, ""]
    for f, tp in subsections:
        _doc_section(tp, f"{prefix}{f.name}.", lines)


def render_docs() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m rollflow.configuration.loader --docs > docs/configuration.md`. "
        "Do not edit by hand; a test fails when this file is stale. -->",
        "",
        "A run is configured by one `ExperimentConfig` tree. Values come from the defaults below, then a",
        "YAML file (`configs/tiny_cpu.yaml`), then dotted overrides (`train.lr=1e-5`). Unknown keys, wrong",
        "types and impossible values are rejected with an error that names the key and the fix.",
        "Fields marked secret are redacted from logs and MLflow params, and so are credentials found by",
        "value (`rollflow/configuration/redact.py`): URL userinfo (`s3://key:secret@...`), `Bearer` tokens, secret-named",
        "mapping entries and flags (`--api-key X`), and any such value wherever else it appears. Take",
        "credentials from the environment or Prefect Secret blocks, not from parameters.",
        "",
    ]
    _doc_section(ExperimentConfig, "", lines)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", action="store_true", help="print docs/configuration.md")
    parser.add_argument("--config", help="YAML file to resolve and print")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5")
    args = parser.parse_args(argv)
    if args.docs:
        sys.stdout.write(render_docs())
        return 0
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
