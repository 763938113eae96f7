"""``preload_libraries``: after it, ``transformers`` holds the names ``datasets``' hasher reads, so a loop that
hashes a JSONL dataset while another thread imports ``transformers`` cannot see a half-imported module."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import sys\n"
    "from rollflow.data.preload import preload_libraries\n"
    "assert 'transformers' not in sys.modules or 'PreTrainedTokenizerBase' not in vars(sys.modules['transformers'])\n"
    "preload_libraries()\n"
    "t = vars(sys.modules['transformers'])\n"
    "assert all(n in t for n in ('PreTrainedTokenizerBase', 'AutoModelForCausalLM')), sorted(t)[:5]\n"
    "assert 'datasets' in sys.modules\n"
)


def test_preload_resolves_the_names_other_threads_read() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_flow_preloads_before_it_submits_its_loops() -> None:
    from pathlib import Path

    src = (Path(__file__).resolve().parents[2] / "flows" / "embedded.py").read_text()  # the embedded run
    assert src.index("preload_libraries()") < src.index("train_loop.submit(")
