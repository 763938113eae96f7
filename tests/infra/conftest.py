"""Re-exports the inference fixtures of tests/rollout/conftest.py (tiny model, session CPU server).

pytest only shares conftest fixtures down a directory tree, so this file loads that module by path and
re-binds its fixtures here. The session instances (model dirs, the server) are shared between the two
directories through a process-wide holder in that module; hoisting the fixtures into tests/conftest.py
would make this file unnecessary.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "rollout" / "conftest.py"
_NAME = "rollflow_tests_inference_fixtures"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _mod
    _spec.loader.exec_module(_mod)
_shared = sys.modules[_NAME]

tiny_model_dir = _shared.tiny_model_dir
tiny_model_dir_b = _shared.tiny_model_dir_b
cpu_server = _shared.cpu_server
inference_lib = _shared.inference_lib
