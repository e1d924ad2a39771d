"""Valid bpc against the forward budget, and training time, of `lm.sh`'s runs.

Usage::

    python -m experiments.reversible.table --root OUT [--output OUT/table.json]

Reads each ``OUT/<variant>_s<seed>/`` written by ``experiments/reversible/lm.sh``: its
``evaluation.json`` (`launch.evaluate` at every budget: the validation split's bits per
character and mean solver steps) and its ``lm_report.json`` (``train_seconds``). Prints
one Markdown row per variant: valid bpc at each budget (mean +- standard deviation over
the seeds found) and the training seconds, with the training time relative to the IFT
DEQ's (``deq``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Sequence

from absl import app, flags

from deq_jax.training.run.writers import write_json

_ROOT = flags.DEFINE_string("root", "", "The OUT directory of experiments/reversible/lm.sh.")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the rows as JSON here.")

VARIANTS = ("deq", "jacobian", "reversible")
RUN = re.compile(r"^(?P<variant>[a-z_]+)_s(?P<seed>\d+)$")


def read_run(workdir: str) -> dict:
    """``{"budgets": {K: (bpc, nstep_mean)}, "train_seconds": s}`` of one run.

    Raises:
      FileNotFoundError: if the run has no ``evaluation.json`` or ``lm_report.json``.
    """
    with open(os.path.join(workdir, "evaluation.json")) as f:
        table = json.load(f)
    with open(os.path.join(workdir, "lm_report.json")) as f:
        report = json.load(f)
    budgets = {}
    for key, splits in table.items():
        if key.startswith("max_iter="):
            valid = splits["valid"]
            budgets[int(key.split("=")[1])] = (valid["bpc"], valid.get("nstep_mean"))
    return {"budgets": budgets, "train_seconds": report["train_seconds"]}


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def rows(root: str) -> dict[str, list[dict]]:
    """The runs under ``root`` by variant."""
    found: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(root)):
        match = RUN.match(name)
        if match and os.path.isdir(os.path.join(root, name)):
            run = read_run(os.path.join(root, name))
            run["seed"] = int(match["seed"])
            found.setdefault(match["variant"], []).append(run)
    return found


def markdown(found: dict[str, list[dict]]) -> str:
    budgets = sorted({k for runs in found.values() for r in runs for k in r["budgets"]})
    base = found.get("deq")
    base_seconds = statistics.mean(r["train_seconds"] for r in base) if base else None
    head = ["run", "seeds", *map(str, budgets), "train s", "train s / DEQ's"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for variant in [v for v in VARIANTS if v in found] + sorted(set(found) - set(VARIANTS)):
        runs = found[variant]
        cells = [variant, str(len(runs))]
        for k in budgets:
            values = [r["budgets"][k][0] for r in runs if k in r["budgets"]]
            cells.append(_mean_sd(values) if values else "")
        seconds = statistics.mean(r["train_seconds"] for r in runs)
        cells.append(f"{seconds:.0f}")
        cells.append(f"{seconds / base_seconds:.2f}" if base_seconds else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    del argv
    if not _ROOT.value:
        raise app.UsageError("--root is required.")
    found = rows(_ROOT.value)
    if not found:
        raise app.UsageError(f"No <variant>_s<seed> runs under {_ROOT.value}.")
    print(markdown(found))
    if _OUTPUT.value:
        write_json(_OUTPUT.value, found)


if __name__ == "__main__":
    app.run(main)
