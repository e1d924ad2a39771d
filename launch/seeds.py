"""Train seeds for the report commands: parsing ``--seeds``, one workdir per seed, and
the mean and standard deviation over seeds.

Flag-free (the reports define their own ``--seeds`` where they define their flags), so
any report may import it. A seed is ``train.seed``: the initialisation and the order
of the training batches; the data stay the same.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


def parse_seeds(values: Iterable[str | int]) -> list[int]:
    """``["0", "1", "2"]`` (a ``DEFINE_list`` flag's value) as ``[0, 1, 2]``.

    Raises:
      ValueError: for an empty list, a value that is not a non-negative integer, or
        a repeated seed, naming ``--seeds``.
    """
    seeds = []
    for value in values:
        text = str(value).strip()
        if not text.isdigit():
            raise ValueError(f"--seeds={text!r}: each seed is a non-negative integer, e.g. 0,1,2.")
        seeds.append(int(text))
    if not seeds:
        raise ValueError("--seeds is empty: name at least one train seed, e.g. --seeds=0,1,2.")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds={','.join(map(str, seeds))} repeats a seed.")
    return seeds


def seeds_or_count(values: Sequence[str], count: int = 0) -> list[int]:
    """The train seeds of ``--seeds`` (`parse_seeds`), or of a report's older count
    flag (``--synthetic_seeds=N``: ``0..N-1``); ``[0]`` without either.

    Raises:
      ValueError: when both are given.
    """
    if values and count:
        raise ValueError("Pass --seeds or the seed count, not both.")
    return parse_seeds(values) if values else list(range(count or 1))


def seed_workdir(root: str, seed: int) -> str:
    """The workdir of one seed's run under a report's run directory: ``{root}/seed{seed}``."""
    return os.path.join(root, f"seed{seed}")


def mean_std(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """``{"mean", "std", "n"}`` over the values given (``None`` and NaN, a seed that
    diverged or lacks the value, are left out and not counted in ``n``; an infinite
    value stays, so the mean says a seed blew up).

    ``std`` is the population standard deviation (numpy's default, ``ddof=0``; 0 for one
    value); ``mean`` and ``std`` are ``None`` when no value is left.
    """
    kept = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not kept:
        return {"mean": None, "std": None, "n": 0}
    array = np.asarray(kept, np.float64)
    with np.errstate(invalid="ignore"):  # an infinite value: a NaN std, said as such
        return {"mean": float(array.mean()), "std": float(array.std()), "n": len(kept)}


def aggregate(
    rows: Sequence[Mapping[str, Any]], group_by: Sequence[str], keys: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per group of ``rows`` (those equal on every ``group_by`` key, in first-seen
    order): the group's keys, ``seeds`` (the ``seed`` of each row) and, for each of
    ``keys``, ``{key}_mean``, ``{key}_std`` and ``{key}_n`` (`mean_std`; a row without
    the key counts as missing).
    """
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in group_by), []).append(row)
    out = []
    for values, members in groups.items():
        summary: dict[str, Any] = dict(zip(group_by, values, strict=True))
        summary["seeds"] = [m.get("seed") for m in members]
        for key in keys:
            stats = mean_std([m.get(key) for m in members])
            for name, value in stats.items():
                summary[f"{key}_{name}"] = value
        out.append(summary)
    return out


def format_mean_std(
    summary: Mapping[str, Any],
    key: str,
    scale: float = 1.0,
    digits: int = 1,
    signed: bool = False,
) -> str:
    """``"96.4 ± 0.5"``: ``{key}_mean`` ± ``{key}_std`` of an `aggregate` row, times
    ``scale`` (``signed``: the mean with its sign, ``"+0.2 ± 0.0"``, as for a gap);
    ``"-"`` without a mean."""
    mean, std = summary.get(f"{key}_mean"), summary.get(f"{key}_std")
    if mean is None:
        return "-"
    sign = "+" if signed else ""
    return f"{scale * mean:{sign}.{digits}f} ± {scale * std:.{digits}f}"
