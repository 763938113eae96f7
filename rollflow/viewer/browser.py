"""Headless Chromium from Python: a page's DOM after rendering, and a screenshot of it.

What it is: ``find_chromium()`` (Debian's ``chromium``, else ``chromium-browser`` / ``google-chrome``)
and ``render(url, dump_dom=True | screenshot=PATH)``, one browser process per call with a throw-away
profile and no background network (no sync, no component updates, no first-run). The viewer's tests
and ``bench/query.py`` use it; ``apt-get install chromium`` provides it (the Makefile's ``browser``
target does that for ``make test``).

What it is not: a browser automation library (no clicks, no JavaScript), or needed to run the viewer.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def render(
    url: str,
    *,
    screenshot: Path | None = None,
    size: tuple[int, int] = (1280, 900),
    timeout_s: float = 60.0,
    extra_args: tuple[str, ...] = (),
) -> str:
    """Load ``url`` headless; returns the rendered DOM (``--dump-dom``), or writes a PNG to ``screenshot``."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium found: `apt-get install -y chromium` (Debian) installs it")
    with tempfile.TemporaryDirectory(prefix="rollflow-chromium-") as profile:
        args = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            *extra_args,
        ]
        args += [f"--screenshot={screenshot}"] if screenshot is not None else ["--dump-dom"]
        done = subprocess.run([*args, url], capture_output=True, timeout=timeout_s, check=False)
    if screenshot is not None:
        if not screenshot.is_file():
            raise RuntimeError(
                f"chromium wrote no screenshot (status {done.returncode}): {done.stderr.decode()[-500:]}"
            )
        return ""
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed (status {done.returncode}): {done.stderr.decode()[-500:]}")
    return done.stdout.decode()
