"""Reading a file once while hashing the same bytes on a second thread.

What it is: ``HashingReader(path, algo)`` reads one local file in order into buffers its caller owns
(``readinto``: the memory of a tensor about to be built, say), and hands each filled piece to a helper
thread that hashes it while the next piece is read; ``finish()`` reads whatever the caller did not ask
for (hashed too), waits for the hash and returns the file's ``FileDigest``. Every byte comes from the
file once, and the digest is of exactly the bytes that landed in the caller's buffers, so a caller that
compares it to COMMIT.json before using those buffers has verified what it uses (no window between a
hash pass and a later read). ``read_verified(path, expect, algo, name)`` is the small-file form: the
whole file into memory, checked against its COMMIT.json entry (``CheckpointIntegrityError`` naming it).

Why a thread: hashlib and blake3 release the GIL on large buffers, and so does ``readinto``, so the hash
of piece i runs on another core beside the read of piece i + 1. Pieces are ``PIECE`` bytes (8 MiB): small
enough that the last hash ends soon after the last read, large enough to keep the per-call cost low.

What it is not: a verifier of anything by itself (the caller compares the digest, before it uses the
bytes), nor a reader of remote files (``storage.transfer`` moves those, hashing on the way).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storage.checkpoint_commit import check_digest
from storage.errors import CheckpointIntegrityError
from storage.transfer import FileDigest, new_hasher

PIECE = 8 * 2**20


class HashingReader:
    """One file read once, in order; every piece read is hashed on a helper thread. Use as a context manager."""

    def __init__(self, path: str | Path, algo: str, name: str | None = None) -> None:
        self.name = name or Path(path).name
        self.algo = algo
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close() / __exit__
        self.size = os.fstat(self._f.fileno()).st_size  # as opened: a rename after this cannot swap it
        self.pos = 0
        self._h = new_hasher(algo)
        self._q: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._t = threading.Thread(target=self._hash_loop, name="hashing-reader", daemon=True)
        self._t.start()

    def _hash_loop(self) -> None:
        while (piece := self._q.get()) is not None:
            if self._error is None:
                try:
                    self._h.update(piece)
                except BaseException as e:  # re-raised by finish()
                    self._error = e

    def readinto(self, buf: Any) -> None:
        """Fill ``buf`` (any writable buffer) with the next ``len(buf)`` bytes of the file; each piece is
        queued for hashing once it is read. ``CheckpointIntegrityError`` if the file ends first."""
        view = memoryview(buf).cast("B")
        for i in range(0, view.nbytes, PIECE):
            piece = view[i : i + PIECE]
            got = 0
            while got < piece.nbytes:
                n = self._f.readinto(piece[got:])
                if not n:
                    raise CheckpointIntegrityError(self.name, f"ends at byte {self.pos + got} (truncated)")
                got += n
            self.pos += got
            self._q.put(piece)

    def finish(self) -> FileDigest:
        """Read (and hash) the rest of the file, wait for the hash; the digest of every byte read."""
        rest = self.size - self.pos
        if rest > 0:
            self.readinto(bytearray(rest))
        if self._f.read(1):  # it grew after it was opened: the bytes hashed are not the whole file
            raise CheckpointIntegrityError(self.name, "grew while it was read")
        self._q.put(None)
        self._t.join()
        if self._error is not None:
            raise self._error
        return FileDigest(self.pos, self._h.hexdigest(), self.algo)

    def close(self) -> None:
        if self._t.is_alive():
            self._q.put(None)
            self._t.join()
        self._f.close()

    def __enter__(self) -> HashingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_verified(path: str | Path, expect: Mapping[str, Any], algo: str, name: str) -> bytes:
    """The bytes of a (small) file, read once and checked against ``expect`` (its COMMIT.json entry)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CheckpointIntegrityError(name, "missing from storage") from None
    h = new_hasher(algo)
    h.update(data)
    check_digest(name, FileDigest(len(data), h.hexdigest(), algo), expect, algo)
    return data
