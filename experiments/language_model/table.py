"""A results table over language-model runs: each group of seeds as mean and spread.

Usage::

    python -m experiments.language_model.table --group deq=/tmp/lm_s0,/tmp/lm_s1,/tmp/lm_s2 \\
        --group weight_tied=/tmp/wt_s0,/tmp/wt_s1,/tmp/wt_s2

Reads each workdir's ``lm_report.json`` (written at the end of
`deq_jax.training.train_and_evaluate`) and its ``metrics.jsonl`` (the backward solver
steps of the last logged training steps), and prints a Markdown table: per group the
number of seeds, parameters, validation and test bits per character (or perplexity) as
mean +- standard deviation over the seeds, the forward solver steps per segment on the
validation split, the backward steps at the end of training, and training and
evaluation tokens per second. ``--output`` also writes the rows as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from absl import app, flags

from deq_jax.training.run.writers import write_json
from launch import seeds

_GROUPS = flags.DEFINE_multi_string("group", [], "name=workdir,workdir,... (one per group).")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the rows as JSON here.")

REPORT_FILE = "lm_report.json"


def read_run(workdir: str) -> dict:
    """The final report of one run, plus its last logged backward solver steps.

    Raises:
      FileNotFoundError: if the run has no ``lm_report.json`` (it did not finish).
    """
    path = os.path.join(workdir, REPORT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No {REPORT_FILE} in {workdir}: the run did not finish.")
    with open(path) as f:
        report = json.load(f)
    train = []
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            train = [r for r in map(json.loads, f) if r.get("split") == "train"]
    report["bwd_nstep_mean"] = train[-1].get("bwd_nstep_mean") if train else None
    report["train_nstep_mean"] = train[-1].get("nstep_mean") if train else None
    return report


def summarize(name: str, reports: Sequence[dict]) -> dict:
    """One table row: means and standard deviations over the seeds of a group."""
    headline = "bpc" if "bpc" in reports[0]["eval"]["valid"] else "ppl"

    def stat(values):
        summary = seeds.mean_std(values)
        return summary["mean"], summary["std"]

    row = {"name": name, "seeds": len(reports), "metric": headline}
    row["parameters"] = reports[0]["parameters"]
    for split in ("valid", "test"):
        row[split] = stat([r["eval"][split][headline] for r in reports])
    row["nstep_valid"] = stat([r["eval"]["valid"]["nstep_mean"] for r in reports])
    row["nstep_train"] = stat([r["train_nstep_mean"] for r in reports])
    row["bwd_nstep"] = stat([r["bwd_nstep_mean"] for r in reports])
    row["train_tokens_per_second"] = stat([r["train_tokens_per_second"] for r in reports])
    row["eval_tokens_per_second"] = stat([r["eval"]["valid"]["tokens_per_second"] for r in reports])
    return row


def _cell(pair: tuple[float | None, float | None], digits: int) -> str:
    mean, spread = pair
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {spread:.{digits}f}"


def markdown(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table."""
    metric = rows[0]["metric"]
    lines = [
        f"| run | seeds | parameters | valid {metric} | test {metric} | forward steps (valid) "
        "| forward / backward steps (train, end) | train tok/s | eval tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['seeds']} | {r['parameters']:,} | {_cell(r['valid'], 3)} "
            f"| {_cell(r['test'], 3)} | {_cell(r['nstep_valid'], 1)} "
            f"| {_cell(r['nstep_train'], 1)} / {_cell(r['bwd_nstep'], 1)} "
            f"| {_cell(r['train_tokens_per_second'], 0)} "
            f"| {_cell(r['eval_tokens_per_second'], 0)} |"
        )
    return "\n".join(lines)


def parse_group(text: str) -> tuple[str, list[str]]:
    """``"name=dir1,dir2"`` -> ``("name", ["dir1", "dir2"])``.

    Raises:
      ValueError: for a group without ``=`` or without workdirs.
    """
    name, sep, dirs = text.partition("=")
    workdirs = [d for d in dirs.split(",") if d]
    if not sep or not name or not workdirs:
        raise ValueError(f"--group must read name=workdir[,workdir...], got {text!r}.")
    return name, workdirs


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not _GROUPS.value:
        raise app.UsageError("Give at least one --group name=workdir[,workdir...].")
    rows = []
    for text in _GROUPS.value:
        name, workdirs = parse_group(text)
        rows.append(summarize(name, [read_run(w) for w in workdirs]))
    print(markdown(rows))
    if _OUTPUT.value:
        write_json(_OUTPUT.value, rows, indent=2)


if __name__ == "__main__":
    app.run(main)
