"""Hashing primitives (`storage.transfer`): both algorithms, hash-while-writing, hash-while-copying.

Every digest is compared with one computed by the hash libraries themselves (hashlib, blake3) over the
file's bytes as read back here, so a primitive that hashed the wrong bytes cannot pass.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import blake3
import pytest

from storage.fs import Storage
from storage.transfer import CHUNK_SIZE, FileDigest, default_hash_algo, hash_file, new_hasher, write_hashed

ALGOS = ["sha256", "blake3"]


def _digest(algo: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if algo == "sha256" else blake3.blake3(data).hexdigest()


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("size", [0, 1000, 3 * 2**20 + 12345])  # empty, one piece, pieces across parts
def test_digest_computed_while_writing_equals_a_digest_of_the_file(
    tmp_path: Path, algo: str, size: int
) -> None:
    data = os.urandom(size)
    parts = [data[: size // 3], memoryview(data)[size // 3 : size // 2], bytearray(data[size // 2 :])]
    with open(tmp_path / "f.bin", "wb", buffering=0) as f:
        got = write_hashed(f, parts, algo)
    on_disk = (tmp_path / "f.bin").read_bytes()
    assert on_disk == data
    assert got == FileDigest(size, _digest(algo, on_disk), algo)
    assert hash_file(tmp_path / "f.bin", algo) == got  # mapped (blake3, >= 1 MiB) or read


def test_write_hashed_takes_typed_buffers(tmp_path: Path) -> None:
    import numpy as np

    arr = np.arange(10, dtype=np.float32)  # format "f", cast to bytes
    buf = io.BytesIO()
    got = write_hashed(buf, [b"head", arr], "blake3")
    assert buf.getvalue() == b"head" + arr.tobytes()
    assert got.digest == _digest("blake3", buf.getvalue()) and got.size == 4 + 40


def test_unknown_algorithm_and_sha256_compat() -> None:
    with pytest.raises(ValueError, match="known: sha256, blake3"):
        new_hasher("md5")
    assert default_hash_algo() == "blake3"
    d = FileDigest(3, _digest("sha256", b"abc"))
    assert d.algo == "sha256" and d.sha256 == d.digest  # callers that predate `algo`
    with pytest.raises(ValueError, match="blake3"):
        _ = FileDigest(3, _digest("blake3", b"abc"), "blake3").sha256


@pytest.mark.parametrize("algo", ALGOS)
def test_put_and_get_file_hash_on_the_way_with_either_algorithm(
    storage: Storage, tmp_path: Path, algo: str
) -> None:
    data = os.urandom(CHUNK_SIZE + 999)  # multipart on S3, threaded copy locally
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    up = storage.put_file(src, "files/big.bin", algo=algo)
    assert up == FileDigest(len(data), _digest(algo, data), algo)
    down = storage.get_file("files/big.bin", tmp_path / "out.bin", size=len(data), algo=algo)
    assert down == up and (tmp_path / "out.bin").read_bytes() == data
    small = storage.get_file("files/big.bin", tmp_path / "o2.bin", algo=algo)  # no size hint
    assert small == up
