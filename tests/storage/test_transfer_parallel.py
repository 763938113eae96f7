"""Hashing on all cores (`new_hasher(parallel=True)`, `storage.transfer.HASH_PARALLEL`).

Digests are checked against published values for a known input and against the hash libraries run on
one core over the same bytes, so a threaded path that hashed other bytes (or in another order) fails.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import blake3
import pytest

from storage import transfer
from storage.transfer import (
    FileDigest,
    copy_file_hashed,
    copy_hashed,
    hash_file,
    new_hasher,
    write_hashed,
)

# Published digests of b"abc" (FIPS 180-2 for sha256; the BLAKE3 reference implementation).
ABC = {
    "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    "blake3": "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85",
}
BIG = 20 * 2**20 + 4321  # more than one 16 MiB chunk and many 1 MiB pieces, a multiple of neither


def _data(n: int) -> bytes:
    """Deterministic, non-repeating-per-chunk bytes (a digest over misordered pieces would differ)."""
    return b"".join(hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(-(-n // 32)))[:n]


def _one_core(algo: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if algo == "sha256" else blake3.blake3(data).hexdigest()


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("parallel", [False, True])
def test_known_digest_of_abc(algo: str, parallel: bool) -> None:
    h = new_hasher(algo, parallel=parallel)
    h.update(b"a")
    h.update(b"bc")
    assert h.hexdigest() == ABC[algo]


@pytest.mark.parametrize("threads_on", [True, False])
def test_every_bulk_path_gives_the_one_core_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads_on: bool
) -> None:
    monkeypatch.setattr(transfer, "HASH_PARALLEL", threads_on)
    data = _data(BIG)
    want = FileDigest(BIG, _one_core("blake3", data), "blake3")
    with open(tmp_path / "w.bin", "wb", buffering=0) as f:
        assert write_hashed(f, [data[:5], memoryview(data)[5:]], "blake3") == want
    assert (tmp_path / "w.bin").read_bytes() == data
    assert hash_file(tmp_path / "w.bin", "blake3") == want  # memory-mapped
    dst = io.BytesIO()
    assert copy_hashed(io.BytesIO(data), dst, algo="blake3") == want
    assert dst.getvalue() == data


def test_hash_file_on_all_cores_gives_the_one_core_digest_of_a_small_file(tmp_path: Path) -> None:
    """Below the mapping threshold the file is read through a buffer: the same digest either way."""
    data = _data(1000)
    (tmp_path / "s.bin").write_bytes(data)
    for algo in ("sha256", "blake3"):
        assert hash_file(tmp_path / "s.bin", algo) == FileDigest(1000, _one_core(algo, data), algo)


@pytest.mark.parametrize(("threads_on", "expect"), [(True, blake3.blake3.AUTO), (False, None)])
def test_hash_file_asks_blake3_for_all_cores_unless_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads_on: bool, expect: int | None
) -> None:
    real, asked = blake3.blake3, []

    def recording(*args: object, **kw: int) -> object:
        asked.append(kw.get("max_threads"))
        return real(*args, **kw)

    recording.AUTO = real.AUTO  # type: ignore[attr-defined]
    monkeypatch.setattr(blake3, "blake3", recording)
    monkeypatch.setattr(transfer, "HASH_PARALLEL", threads_on)
    data = _data(2 * 2**20)  # mapped
    (tmp_path / "m.bin").write_bytes(data)
    assert hash_file(tmp_path / "m.bin", "blake3").digest == real(data).hexdigest()
    assert asked == [expect]


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("size", [0, 3, BIG])
def test_copy_file_hashed_hashes_the_copy(tmp_path: Path, algo: str, size: int) -> None:
    data = _data(size)
    (tmp_path / "src.bin").write_bytes(data)
    got = copy_file_hashed(tmp_path / "src.bin", tmp_path / "dst.bin", algo)
    assert (tmp_path / "dst.bin").read_bytes() == data
    assert got == FileDigest(size, _one_core(algo, data), algo)
    if size:  # a real copy: rewriting the source leaves the copy alone
        (tmp_path / "src.bin").write_bytes(b"x" * size)
        assert (tmp_path / "dst.bin").read_bytes() == data


def test_copy_file_hashed_of_abc_is_the_published_digest(tmp_path: Path) -> None:
    (tmp_path / "abc").write_bytes(b"abc")
    for algo, digest in ABC.items():
        assert copy_file_hashed(tmp_path / "abc", tmp_path / f"out-{algo}", algo).digest == digest
