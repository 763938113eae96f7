"""Make PyPI's SGLang 0.5.23 import on a CPU-only torch: two source edits inside ``.venv-sglang``, idempotent.

What it is: the last step of ``make sglang-venv`` (run with that venv's Python). SGLang's real server runs
on these CPUs on its plain-torch path (``--device cpu --attention-backend torch_native``), but two imports
stand in its way, neither of which the text server ever calls:

1. ``torchvision`` (imported at module level by SGLang's multimodal configs): PyPI has only its CUDA
   build, whose C extension cannot load beside the CPU torch, and its ``_meta_registrations`` then dies
   with ``operator torchvision::nms does not exist``. The two ``register_fake`` decorators for ``nms`` and
   ``qnms`` are guarded with ``torchvision.extension._has_ops()``, as the other registrations in that file
   already are.
2. ``sglang/srt/layers/rotary_embedding/base.py`` imports ``vllm._custom_ops.rotary_embedding`` on a
   platform it does not recognise (CPU without ``SGLANG_USE_CPU_ENGINE``, which needs a CPU
   ``sgl_kernel`` PyPI lacks) and then uses ``forward_native``. The import becomes a function that raises
   if it is ever called, so a path that would call it fails loudly instead of silently.

What it is not: a fork of either package (nothing else changes), or needed on GPUs (the GPU image
installs SGLang's CUDA build unchanged). ``python infra/sglang_cpu_patch.py --check`` exits non-zero
when either edit is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

MARK = "# rollflow: guarded for a CPU-only torch (infra/sglang_cpu_patch.py)"

_TV_OLD = (
    '@torch.library.register_fake("torchvision::nms")',
    '@torch.library.register_fake("torchvision::qnms")',
)
_TV_NEW = tuple(
    f"@(torch.library.register_fake({op!r}) if torchvision.extension._has_ops() else (lambda f: f))  {MARK}"
    for op in ("torchvision::nms", "torchvision::qnms")
)
_ROPE_OLD = "                from vllm._custom_ops import rotary_embedding\n"
_ROPE_NEW = (
    f"                def rotary_embedding(*a, **k):  {MARK}\n"
    '                    raise RuntimeError("vllm._custom_ops.rotary_embedding is not available on CPU")\n'
)


class PatchError(RuntimeError):
    """The file to edit holds neither the original line nor the edit: another version of the package."""


def _package_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"package {package!r} is not installed in {sys.prefix}; run `make sglang-venv`")
    return Path(next(iter(spec.submodule_search_locations))) / rel


def _edit(path: Path, pairs: list[tuple[str, str]], check: bool) -> bool:
    """Replace each old text by its new one; True if the file already held every edit."""
    text = path.read_text()
    done = True
    for old, new in pairs:
        if new in text:
            continue
        done = False
        if old not in text:
            raise PatchError(f"{path}: neither {old.strip()!r} nor its edit found (another version?)")
        text = text.replace(old, new)
    if not done and not check:
        path.write_text(text)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether both edits are in place")
    args = ap.parse_args(argv)
    tv = _package_file("torchvision", "_meta_registrations.py")
    rope = _package_file("sglang", "srt/layers/rotary_embedding/base.py")
    results = {
        tv: _edit(tv, list(zip(_TV_OLD, _TV_NEW, strict=True)), args.check),
        rope: _edit(rope, [(_ROPE_OLD, _ROPE_NEW)], args.check),
    }
    for path, was_done in results.items():
        print(f"{path}: {'in place' if was_done else ('missing' if args.check else 'edited')}")
    return 1 if args.check and not all(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
