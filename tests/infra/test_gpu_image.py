"""The GPU image installs rollflow without moving SGLang's torch and transformers, and checks it.

No Docker here: the Dockerfiles are parsed (the install line, the pins written before it, the check
after it), ``check_pins.py`` runs for real against this environment, and the image's requirement list
is held in step with pyproject.toml. ``make install TORCH_INDEX=...`` is checked with ``make -n``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "infra" / "docker"
CHECK = DOCKER / "check_pins.py"
FROM_BASE = {"torch", "transformers", "tokenizers"}  # the base image brings these; never installed over


def _runs(dockerfile: Path) -> list[str]:
    """The RUN instructions, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [ln.strip()[4:] for ln in text.splitlines() if ln.strip().startswith("RUN ")]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_gpu_dockerfile_pins_the_base_installs_without_deps_and_checks() -> None:
    runs = _runs(DOCKER / "Dockerfile.gpu")
    write = next(i for i, r in enumerate(runs) if "check_pins.py --write" in r)
    install = next(i for i, r in enumerate(runs) if "pip install" in r and " -e ." in r)
    check = next(i for i, r in enumerate(runs) if re.search(r"check_pins\.py (?!--write)", r))
    assert write < install < check, runs
    rollflow_install, deps_install = (p.strip() for p in runs[install].split("&&"))
    assert "--no-deps" in rollflow_install  # pyproject's torch/transformers ranges resolve nothing
    assert "-c /opt/rollflow-build/base-pins.txt" in deps_install and "-r " in deps_install
    assert not any(re.search(r"pip install[^&]*\b(torch|transformers)\b[=<> ]", r) for r in runs), runs


def test_user_dockerfile_installs_on_top_with_the_pins_and_checks() -> None:
    (run,) = _runs(DOCKER / "Dockerfile.user")
    assert (
        "-c /opt/rollflow-build/base-pins.txt" in run
        and "check_pins.py /opt/rollflow-build/base-pins.txt" in run
    )
    assert "FROM ${ROLLFLOW_IMAGE}" in (DOCKER / "Dockerfile.user").read_text()


def test_requirements_follow_pyproject_except_what_the_base_brings() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {_name(d) for d in deps} - FROM_BASE
    lines = [ln.split("#", 1)[0].strip() for ln in (DOCKER / "requirements-gpu.txt").read_text().splitlines()]
    listed = {_name(ln) for ln in lines if ln}
    assert listed == wanted, f"missing: {wanted - listed}, extra: {listed - wanted}"


def _check(pins: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), str(pins)], capture_output=True, text=True, timeout=60)


def test_check_pins_passes_unchanged_and_names_what_moved(tmp_path: Path) -> None:
    pins = tmp_path / "pins.txt"
    subprocess.run([sys.executable, str(CHECK), "--write", str(pins)], check=True, timeout=60)
    written = pins.read_text()
    assert re.search(r"^torch==\S+$", written, re.M) and re.search(r"^transformers==\S+$", written, re.M)
    ok = _check(pins)
    assert ok.returncode == 0 and "unchanged" in ok.stdout, ok.stderr
    moved = pins.read_text().replace("torch==", "torch==0.0.1+was-")  # as if pip had replaced torch
    pins.write_text(moved)
    bad = _check(pins)
    assert bad.returncode == 1
    assert "check_pins: torch was 0.0.1+was-" in bad.stderr and "is now" in bad.stderr


def test_check_pins_refuses_a_base_with_transformers_4() -> None:
    sys.path.insert(0, str(DOCKER))
    try:
        from check_pins import problems
    finally:
        sys.path.remove(str(DOCKER))
    found = problems({"transformers": "4.57.1"}, {"transformers": "4.57.1"})
    assert found == ["rollflow needs transformers >= 5; the base image has 4.57.1: use a newer base image"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "--disable-pip-version-check torch==2.13.0"),
        (
            ["TORCH_INDEX=https://download.pytorch.org/whl/cpu"],
            "--disable-pip-version-check --index-url https://download.pytorch.org/whl/cpu torch==2.13.0",
        ),
    ],
)
def test_make_install_takes_a_torch_index(args: list[str], expected: str) -> None:
    out = subprocess.run(
        ["make", "-n", "-B", "install", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )  # -n: print the recipe, run nothing; -B: as on a fresh machine
    (line,) = [ln for ln in out.stdout.splitlines() if "pip install" in ln and "torch==2.13.0" in ln]
    assert " ".join(line.split()).endswith(expected), line
