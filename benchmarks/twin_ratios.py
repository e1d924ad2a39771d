"""The ratio of deq_jax's times to the PyTorch twins', per model and tag, as markdown.

Reads the JSON-lines records of `benchmarks.step_time` (``--records``) and those of the
torchdeq twins (``--twin_records``: ``lm_twin.py`` / ``mdeq_twin.py`` in the shared
benchmarks' ``torch_twins``), pairs them by ``(model, tag)`` (the last record of a pair
in each file wins) and prints, for each pair, the medians of ``train_ms``, ``eval_ms``
and ``f_eval_ms`` on both sides and their ratio deq_jax / twin (below 1: deq_jax is
faster). Records without a partner are listed under the table. Measure the two sides
interleaved on one machine (``benchmarks/twins.sh``): the ratios of one run compare,
absolute times across days do not::

    python -m benchmarks.twin_ratios --records /tmp/twins/jax.jsonl \\
        --twin_records /tmp/twins/twin.jsonl
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from absl import app, flags

_RECORDS = flags.DEFINE_string("records", None, "deq_jax's records (benchmarks.step_time).")
_TWIN_RECORDS = flags.DEFINE_string("twin_records", None, "The twins' records.")

TIMES = (("train_ms", "train ms"), ("eval_ms", "eval ms"), ("f_eval_ms", "f(z) ms"))

Pair = tuple[tuple[str, str], dict[str, Any], dict[str, Any]]


def read(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _by_key(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(model, tag): record}``, the last record of a key winning, in first-seen order."""
    keyed: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        keyed[(record["model"], record.get("tag", ""))] = record
    return keyed


def pair(ours: Sequence[dict[str, Any]], twins: Sequence[dict[str, Any]]) -> list[Pair]:
    """``[((model, tag), our record, twin record)]`` for every key both sides have, in
    the order of ``ours``."""
    theirs = _by_key(twins)
    return [(key, r, theirs[key]) for key, r in _by_key(ours).items() if key in theirs]


def unpaired(ours: Sequence[dict[str, Any]], twins: Sequence[dict[str, Any]]) -> list[str]:
    """``"side model/tag"`` for every record key one side lacks."""
    a, b = _by_key(ours), _by_key(twins)
    return [f"jax {m}/{t}" for m, t in a if (m, t) not in b] + [
        f"twin {m}/{t}" for m, t in b if (m, t) not in a
    ]


def ratios(pairs: Sequence[Pair]) -> list[dict[str, Any]]:
    """``[{model, tag, train_ms, eval_ms, f_eval_ms}]``: the ratios of the medians, ours
    over the twin's (``None`` where a side lacks the time)."""
    rows = []
    for (model, tag), ours, twin in pairs:
        row: dict[str, Any] = {"model": model, "tag": tag}
        for key, _ in TIMES:
            if key in ours and key in twin and twin[key]["median"]:
                row[key] = ours[key]["median"] / twin[key]["median"]
            else:
                row[key] = None
        rows.append(row)
    return rows


def _cell(record: dict[str, Any], key: str) -> str:
    """A median in milliseconds, as the table prints it (``-`` where missing)."""
    if key not in record:
        return "-"
    value = record[key]["median"]
    return f"{value:.1f}" if key == "f_eval_ms" else f"{value:.0f}"


def markdown(pairs: Sequence[Pair]) -> str:
    """The markdown table of ``pairs``: each time on both sides and its ratio."""
    head = ["model", "tag"]
    for _, name in TIMES:
        head += [f"{name} jax", f"{name} twin", f"{name.split()[0]} jax/twin"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (3 * len(TIMES))]
    for ((model, tag), ours, twin), row in zip(pairs, ratios(pairs), strict=True):
        cells = [model, tag]
        for key, _ in TIMES:
            ratio = row[key]
            cells += [_cell(ours, key), _cell(twin, key), "-" if ratio is None else f"{ratio:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    """Prints the table of ``--records`` against ``--twin_records``."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    ours, twins = read(_RECORDS.value), read(_TWIN_RECORDS.value)
    print(markdown(pair(ours, twins)))
    missing = unpaired(ours, twins)
    if missing:
        print(f"\nWithout a partner: {', '.join(missing)}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["records", "twin_records"])
    app.run(main)
