"""Storage faults under the S3 path: a fault-injecting proxy between the code and moto's server.

Every committed group must still be consumed exactly once, retried puts must be idempotent, and a
conditional put whose first attempt landed (its response lost) must not be counted as a conflict.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping

import pytest
from faultproxy import FaultProxy
from storage_testlib import make_group

from storage.errors import StorageError
from storage.fs import Storage
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter

pytestmark = pytest.mark.s3


def _open(s3_server, proxy: FaultProxy, trial: str) -> Storage:
    return Storage.open(
        f"s3://{s3_server.bucket}/faults", "test", trial, {**s3_server.options, "endpoint_url": proxy.url}
    )


@pytest.fixture
def trial() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _first_conditional_put(fault: str) -> Iterator[bool]:
    """A rule state: the first PUT carrying If-None-Match gets `fault`, nothing else does."""
    done = False

    def rule(method: str, path: str, headers: Mapping[str, str]) -> str:
        nonlocal done
        if not done and method == "PUT" and any(k.lower() == "if-none-match" for k in headers):
            done = True
            return fault
        return ""

    return rule  # type: ignore[return-value]


@pytest.mark.parametrize("fault", ["reset-after", "500-after"])
def test_retried_conditional_put_is_not_a_conflict(s3_server, trial: str, fault: str) -> None:
    # The exclusive put lands, but its response is lost: the S3 client retries and the retry meets its
    # own object (412 PreconditionFailed). That is success, not CommitConflictError.
    with FaultProxy(s3_server.endpoint_url, rule=_first_conditional_put(fault)) as proxy:  # type: ignore[arg-type]
        storage = _open(s3_server, proxy, trial)
        storage.ensure_bucket()
        storage.put_bytes("c/rec.json", b"record", exclusive=True)
        assert proxy.stats[fault] == 1 and proxy.stats["requests"] >= 3  # put, retried put, get
        assert storage.get_bytes("c/rec.json") == b"record"
        # the same through the writer: one shard committed, counted once
        w = ShardWriter(storage, "w", flush_rows=2)
        proxy.rule = _first_conditional_put(fault)  # type: ignore[assignment]
        assert w.add(make_group("g0")) is not None and proxy.stats[fault] == 2
        assert w.stats == {"rows": 2, "groups": 1, "shards": 1, "evicted": 0}
    groups = ShardReader(_open_direct(s3_server, trial)).take(10).groups
    assert [g.group_id for g in groups] == ["g0"]


def _open_direct(s3_server, trial: str) -> Storage:
    return Storage.open(f"s3://{s3_server.bucket}/faults", "test", trial, s3_server.options)


@pytest.mark.slow
def test_writer_and_reader_under_random_faults_consume_every_group_once(s3_server, trial: str) -> None:
    n_groups = 24
    rates = {"503": 0.06, "500-after": 0.04, "reset": 0.04, "reset-after": 0.04, "slow": 0.04}
    with FaultProxy(s3_server.endpoint_url, seed=1234, rates=rates, slow_s=0.05) as proxy:
        proxy.enabled = False
        _open(s3_server, proxy, trial).ensure_bucket()
        proxy.enabled = True
        writer_storage, reader_storage = _open(s3_server, proxy, trial), _open(s3_server, proxy, trial)
        errors: Counter[str] = Counter()
        taken: list[str] = []
        writer_done = threading.Event()

        def write() -> None:
            w = ShardWriter(writer_storage, "w", flush_rows=4)  # 2 groups per shard
            for i in range(n_groups):
                try:
                    w.add(make_group(f"g{i:03d}", head=i))
                except (StorageError, OSError):
                    errors["write"] += 1  # the shard stays pending; the next flush retries it
            while True:
                try:
                    w.close()
                    break
                except (StorageError, OSError):
                    errors["close"] += 1
            writer_done.set()

        def read() -> None:
            reader = ShardReader(reader_storage)
            while True:
                finished = writer_done.is_set()
                try:
                    res = reader.take(5)
                except (StorageError, OSError):
                    errors["take"] += 1  # all-or-nothing: the cursor did not move
                    continue
                taken.extend(g.group_id for g in res.groups)
                assert res.quarantined == 0
                if finished and not res.groups and len(taken) >= n_groups:
                    return
                if finished and not res.groups:
                    continue
                writer_done.wait(0.05)

        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)
    assert sorted(taken) == [f"g{i:03d}" for i in range(n_groups)]  # every group, exactly once
    assert len(taken) == len(set(taken))
    assert all(proxy.stats[f] > 0 for f in rates)  # each kind of fault happened
    # nothing extra was committed by retries: exactly the groups written, in shards of 2
    records = ShardReader(_open_direct(s3_server, trial)).list_commits(include_consumed=True)
    assert sum(r.groups for r in records) == n_groups and len(records) == n_groups // 2


def _complete_multipart(fault: str):  # noqa: ANN202
    """A rule: the first CompleteMultipartUpload (POST ...?uploadId=) gets `fault`."""
    done = False

    def rule(method: str, path: str, headers: Mapping[str, str]) -> str:
        nonlocal done
        if not done and method == "POST" and "uploadId=" in path:
            done = True
            return fault
        return ""

    return rule


@pytest.mark.parametrize("fault", ["reset-after", "500-after"])
def test_retried_multipart_completion_is_idempotent(s3_server, trial: str, tmp_path, fault: str) -> None:
    # CompleteMultipartUpload lands but its response is lost; the retry finds the upload gone
    # (NoSuchUpload). The object is complete, with exactly the parts sent: that is success.
    src = tmp_path / "big.bin"
    payload = bytes(range(256)) * (5 * 2**20 // 256) + b"tail"  # 5 MiB + 4 bytes: two parts
    src.write_bytes(payload)
    with FaultProxy(s3_server.endpoint_url, rule=_complete_multipart(fault)) as proxy:
        storage = _open(s3_server, proxy, trial)
        storage.chunk_size = 5 * 2**20  # S3's smallest part size
        digest = storage.put_file(src, "ck/big.bin")
        assert proxy.stats[fault] == 1
    assert digest.size == len(payload)
    assert _open_direct(s3_server, trial).get_bytes("ck/big.bin") == payload
