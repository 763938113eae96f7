"""Check a `make demo` log: the run finished and held-out accuracy rose (CI's check of the README's first command).

    python -m bench.demo_check demo.log      # exit 0: after > before; exit 1 with the reason otherwise

Prints ``key value`` lines (``demo_acc_before``, ``demo_acc_after``, ``demo_acc_gain``). It reads the
summary ``flows.async_rl`` prints at the end of a run; a log without one means the demo did not finish.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

KEYS = ("eval_accuracy_before", "eval_accuracy_after")


def read_summary(text: str) -> dict[str, float]:
    """The last value of each of ``KEYS`` printed as ``key value`` at the start of a line."""
    found: dict[str, float] = {}
    for key in KEYS:
        values = re.findall(rf"^{key} ([0-9.]+)\s*$", text, flags=re.MULTILINE)
        if values:
            found[key] = float(values[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.demo_check DEMO_LOG", file=sys.stderr)
        return 2
    summary = read_summary(Path(args[0]).read_text(errors="replace"))
    missing = [k for k in KEYS if k not in summary]
    if missing:
        print(f"demo_check: the demo printed no summary ({', '.join(missing)} missing): it did not finish")
        return 1
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"demo_acc_before {before:.3f}\ndemo_acc_after {after:.3f}\ndemo_acc_gain {after - before:.3f}")
    if after <= before:
        print(f"demo_check: held-out accuracy did not rise ({before:.3f} -> {after:.3f})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
