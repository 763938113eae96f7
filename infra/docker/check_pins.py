"""Check that the packages a base image pinned are still installed at the same versions.

What it is: the GPU image's build check (infra/docker/Dockerfile.gpu, Dockerfile.user). The base image
(SGLang's) brings CUDA builds of torch and the transformers SGLang was tested with; the build writes
them to a pins file before rollflow is installed and runs this after, so a pip resolution that replaced
them fails the build instead of shipping an image whose SGLang or CUDA torch is broken. It also checks
rollflow's own floor (transformers >= 5) against what the base brought.

What it is not: an installer. Standard library only (it runs before and after pip).

Run: python infra/docker/check_pins.py --write PINS   (before: the base's versions of WATCHED)
     python infra/docker/check_pins.py PINS           (after: exit 1, naming each package that moved)
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata

# What SGLang and its CUDA kernels are built against: none of these may move. SGLang 0.5.23 depends on
# ``sglang-kernel`` (its kernels' new name); ``sgl-kernel`` is kept for older base images that have it.
WATCHED = (
    "torch", "torchvision", "torchaudio", "triton", "transformers", "tokenizers", "safetensors",
    "huggingface-hub", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "xgrammar", "numpy",
)  # fmt: skip
# rollflow's own floors on packages it does not install in the GPU image (pyproject.toml).
FLOORS = {"transformers": 5}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(names: tuple[str, ...] = WATCHED) -> dict[str, str]:
    """``{name: version}`` of those of ``names`` that are installed."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[_norm(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def read_pins(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_norm(name)] = version.strip()
    return pins


def problems(pins: dict[str, str], now: dict[str, str]) -> list[str]:
    """Every pinned package that moved or vanished, and every floor the pins break."""
    out = [
        f"{name} was {version} in the base image and is now {now.get(name, 'missing')}"
        for name, version in sorted(pins.items())
        if now.get(name) != version
    ]
    for name, major in FLOORS.items():
        have = now.get(name)
        if have and int(have.split(".")[0]) < major:
            out.append(f"rollflow needs {name} >= {major}; the base image has {have}: use a newer base image")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pins", help="the pins file")
    ap.add_argument("--write", action="store_true", help="write the installed versions to PINS and exit")
    args = ap.parse_args(argv)
    if args.write:
        with open(args.pins, "w", encoding="utf-8") as f:
            f.write("".join(f"{n}=={v}\n" for n, v in sorted(installed().items())))
        return 0
    with open(args.pins, encoding="utf-8") as f:
        pins = read_pins(f.read())
    found = problems(pins, installed(tuple(pins) or WATCHED))
    for line in found:
        print(f"check_pins: {line}", file=sys.stderr)
    if not found:
        print(
            f"check_pins: {len(pins)} base packages unchanged: "
            + ", ".join(f"{n}=={v}" for n, v in pins.items())
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
