"""Fixtures of the trainer tests: a tiny local Llama (built once per session) and a local trial storage.

The shared ``storage`` / ``storage_spec`` fixtures (local + moto S3) come from tests/conftest.py.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # helpers.py (also used by subprocess tests)

from helpers import make_tiny_model  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LlamaForCausalLM (vocab 40, hidden 32, 2 layers) + tokenizer, saved locally."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def local_storage(tmp_path: Path):
    from storage.fs import Storage

    return Storage.open(str(tmp_path / "store"), "test", f"t-{uuid.uuid4().hex[:8]}")
