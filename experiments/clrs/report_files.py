"""The files of the CLRS report (`experiments.clrs.report`): ``clrs_report.{json,md,png}``
written from rows (`write_clrs_report`), rows kept from a workdir's earlier report
(`earlier_rows`), and earlier per-seed reports joined into one (`combine_reports`,
``--combine``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from configs.clrs import MODES
from deq_jax.models.clrs import ALGORITHMS
from experiments.clrs.report_plots import write_figure
from experiments.clrs.tables import GOALS, TARGET, markdown, summary_markdown, summary_rows
from launch import seeds
from launch.runs import write_report

REPORT = "clrs_report"

# The settings every report joined by `combine_reports` must share.
SHARED_SETTINGS = ("steps", "smoke", "overrides")


def write_clrs_report(
    root: str, rows: Sequence[dict], extra: dict[str, Any], emit: Callable[[str], None]
) -> dict[str, Any]:
    """Writes the rows as ``{root}/clrs_report.{json,md,png}`` (with the mean +- std over
    seeds when the rows name theirs) and returns the report: ``rows``, ``summary``,
    ``goals``, ``target``, ``figure`` and ``extra`` (the writers make ``root``)."""
    train_seeds = extra.get("seeds") or []
    summary = summary_rows(rows) if train_seeds else []
    report = dict(rows=list(rows), summary=summary, goals=GOALS, target=TARGET, **extra)
    png = os.path.join(root, f"{REPORT}.png")
    report["figure"] = write_figure(rows, png)
    table = markdown(rows)
    if summary:
        table += f"\nMean ± std over train seeds {list(train_seeds)}:\n\n"
        table += summary_markdown(summary)
    emit(table)
    write_report(os.path.join(root, f"{REPORT}.json"), report, table, also=[png], emit=emit)
    return report


def combine_reports(
    root: str,
    paths: Sequence[str],
    algorithms: Sequence[str] = ALGORITHMS,
    modes: Sequence[str] = MODES,
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Joins the rows of earlier ``clrs_report.json`` files (each from a report run with
    ``--seeds``) of the given algorithms and modes into one report in ``root``, with the
    mean and standard deviation over seeds; trains and loads nothing. Rows are ordered
    by algorithm, mode and seed; ``combined_from`` names the files.

    Raises:
      FileNotFoundError: for a missing file.
      ValueError: for a report without seeds, reports that differ in `SHARED_SETTINGS`
        (naming the setting and the files), a row (algorithm, mode, seed) given twice, or
        no row left.
    """
    reports = {}
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"--combine: no report at {path}.")
        with open(path) as f:
            reports[path] = json.load(f)
        if not reports[path].get("seeds"):
            raise ValueError(
                f"--combine: {path} was not run with --seeds, so its rows name no train seed."
            )
    first = paths[0]
    for key in SHARED_SETTINGS:
        for path, report in reports.items():
            if report.get(key) != reports[first].get(key):
                raise ValueError(
                    f"--combine: {path} has {key}={report.get(key)!r} but {first} has "
                    f"{reports[first].get(key)!r}; only runs of the same settings combine."
                )
    rows, seen = [], {}
    for path, report in reports.items():
        for row in report["rows"]:
            if row["algorithm"] not in algorithms or row["mode"] not in modes:
                continue
            key = (row["algorithm"], row["mode"], row["seed"])
            if key in seen:
                raise ValueError(
                    f"--combine: {key[0]}/{key[1]} seed {key[2]} is in both {seen[key]} and {path}."
                )
            seen[key] = path
            rows.append(row)
    if not rows:
        raise ValueError(
            f"--combine: no row of {list(algorithms)} x {list(modes)} in {list(paths)}."
        )
    sort_rows(rows)
    extra = {key: reports[first].get(key) for key in SHARED_SETTINGS}
    extra.update(merged_settings(rows), combined_from=list(paths))
    return write_clrs_report(root, rows, extra, emit)


def merged_settings(rows: list[dict]) -> dict:
    """The report settings that joined rows determine: ``seeds``, the train seeds they
    name (none for unseeded runs), and ``answer_steps``, whether any holds replayed
    answer steps. Used by ``--combine`` and where a run keeps `earlier_rows`."""
    return dict(
        seeds=sorted({r["seed"] for r in rows if "seed" in r}),
        answer_steps=any(r.get("val_answer_mean") is not None for r in rows),
    )


def earlier_rows(
    root: str, extra: dict[str, Any], rows: Sequence[dict], emit: Callable[[str], None]
) -> list[dict]:
    """The rows of the report already in ``root`` that this invocation keeps: those of
    algorithms, modes and seeds it did not run and whose run directory is still there,
    when that report was run with the same `SHARED_SETTINGS` and, like this one, with or
    without ``--seeds``. So a workdir's report grows over invocations of one algorithm at
    a time, and ``--combine`` of it drops nothing; a report of other settings is
    replaced, and says so."""
    path = os.path.join(root, f"{REPORT}.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        earlier = json.load(f)
    differs = [key for key in SHARED_SETTINGS if earlier.get(key) != extra.get(key)]
    if bool(earlier.get("seeds")) != bool(extra.get("seeds")):
        differs.append("seeds")
    if differs:
        emit(f"Replacing the report in {path}: it was run with other {', '.join(differs)}.")
        return []
    ran = {(r["algorithm"], r["mode"], r.get("seed")) for r in rows}
    kept = [
        r
        for r in earlier["rows"]
        if (r["algorithm"], r["mode"], r.get("seed")) not in ran
        and os.path.isdir(run_workdir(root, r["algorithm"], r["mode"], r.get("seed")))
    ]
    if kept:
        names = sorted({f"{r['algorithm']}/{r['mode']}" for r in kept})
        rows_kept = f"{len(kept)} row" + ("s" if len(kept) > 1 else "")
        emit(f"Keeping {rows_kept} of the earlier report in {path}: {', '.join(names)}.")
    return kept


def run_workdir(root: str, algorithm: str, mode: str, seed: int | None) -> str:
    """Where a run of the report in ``root`` trains: ``{root}/<algorithm>/<mode>``, then
    ``/seed<seed>`` when it has a train seed."""
    workdir = os.path.join(root, algorithm, mode)
    return workdir if seed is None else seeds.seed_workdir(workdir, seed)


def sort_rows(rows: list[dict]) -> None:
    """Orders report rows by algorithm and mode (their orders in `ALGORITHMS` and
    `MODES`), then by train seed."""
    rows.sort(
        key=lambda r: (ALGORITHMS.index(r["algorithm"]), MODES.index(r["mode"]), r.get("seed", -1))
    )
