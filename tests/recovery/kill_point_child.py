"""One life of the fake-client rollout trial of ``test_prompt_accounting``, SIGKILLed by itself at an exact
point of its loop (``bench.kill_audit.install_kill_point``): a helper process of ``test_kill_windows``.

Run: python tests/recovery/kill_point_child.py ROOT POINT NTH   (ROOT: the storage root; POINT: commit | claim)
"""

from __future__ import annotations

import sys

from test_prompt_accounting import Client, _cfg, _roll

from bench.kill_audit import install_kill_point
from storage.fs import Storage

if __name__ == "__main__":
    root, point, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    install_kill_point(point, nth)
    _roll(Storage.open(root, "exp", "t", {}), _cfg(max_epochs=1), Client())
    sys.exit(0)  # the kill point was never reached
