"""Compares the metrics of two training runs record by record (a refactoring's check).

Usage::

    python -m launch.compare_runs --a=/tmp/before --b=/tmp/after

Reads ``metrics.jsonl`` of both workdirs and prints, per run, the number of records and
every metric that differs (exactly, or by more than ``--rtol``), ignoring wall-clock
keys (``*time*``, ``*seconds*``, ``*per_s*``, ``steps_per_sec``). Exits with status 1
when they differ, 0 when every record agrees: two runs of the same config on the same
machine and code path agree bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence

from absl import app, flags

_A = flags.DEFINE_string("a", None, "The first run's workdir.")
_B = flags.DEFINE_string("b", None, "The second run's workdir.")
_RTOL = flags.DEFINE_float("rtol", 0.0, "Relative tolerance (0: exact).")

_WALL_CLOCK = ("time", "seconds", "per_s", "steps_per_sec")


def read_records(workdir: str) -> list[dict]:
    """The records of ``{workdir}/metrics.jsonl``.

    Raises:
      FileNotFoundError: naming the missing file.
    """
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir?")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def differences(a: list[dict], b: list[dict], rtol: float = 0.0) -> list[str]:
    """One line per record count mismatch or differing metric (wall-clock keys skipped)."""
    out = [] if len(a) == len(b) else [f"records: {len(a)} != {len(b)}"]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for key in sorted(set(x) | set(y)):
            if any(word in key for word in _WALL_CLOCK):
                continue
            u, v = x.get(key), y.get(key)
            same = u == v or (
                isinstance(u, float) and isinstance(v, float)
                and (math.isclose(u, v, rel_tol=rtol) or (math.isnan(u) and math.isnan(v)))
            )  # fmt: skip
            if not same:
                where = f"record {i} ({x.get('split', 'train')}, step {x.get('step')})"
                out.append(f"{where}: {key} {u!r} != {v!r}")
    return out


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    a, b = read_records(_A.value), read_records(_B.value)
    diffs = differences(a, b, _RTOL.value)
    print(f"{len(a)} and {len(b)} records; {len(diffs)} difference(s)")
    for line in diffs[:50]:
        print("  " + line)
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    flags.mark_flags_as_required(["a", "b"])
    app.run(main)
