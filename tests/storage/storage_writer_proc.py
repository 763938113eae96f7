"""Child process for the two-writers test: waits for a go-file, then writes groups with a ShardWriter.

Run: python storage_writer_proc.py <spec-json> <writer-name> <n-groups> <go-file>
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from storage_testlib import make_group  # noqa: E402

from storage.fs import Storage  # noqa: E402
from storage.shard_writer import ShardWriter  # noqa: E402


def main() -> None:
    spec, name, n, go = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    storage = Storage.open(spec["root"], spec["experiment"], spec["trial"], spec["options"])
    writer = ShardWriter(storage, name, flush_rows=4)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(n):
        writer.add(make_group(f"{name}-g{i}", head=i % 3))
    writer.close()
    print(json.dumps({"writer_id": writer.writer_id, **writer.stats}))


if __name__ == "__main__":
    main()
