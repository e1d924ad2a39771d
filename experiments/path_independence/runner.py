"""Runs the path-independence study (`experiments.path_independence.study`) and sums it up.

`run_study(root, scale)` trains every run of the grid until it fits or hits its cap
(`train_until_fit`), analyses it (`experiments.path_independence.analysis.analyse_run`: accuracy
on the training size and on harder inputs at 1x-8x the training depth, AA, attacked AA)
and appends one row per run to ``{root}/study.jsonl``; a run already there is not
trained or analysed again, so an interrupted study resumes. Then it writes the summary
(``study_summary.json``), the markdown table (``study.md``), the probit plot of AA
against accuracy (Figure 4, ``study_probit.png``) and the interventions before and after
(Figure 3, ``study_interventions.png``).

The summary holds, per task, Spearman's rank correlation of AA with accuracy at the
largest budget over the runs that fit (the others are reported and left out, as in the
paper), the count of fitted runs with AA < 0.9, the runs whose accuracy falls past the
training depth, and for each intervened run the change of AA and accuracy.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from deq_jax.training import NonFiniteLossError, setup, train_and_evaluate
from deq_jax.training.run.writers import read_metrics, write_json, write_text
from experiments.path_independence import analysis, plots, study
from launch.runs import check_run_config, quiet

ROWS_FILE = "study.jsonl"
SUMMARY_FILE = "study_summary.json"
TABLE_FILE = "study.md"
# AA below this marks a path-dependent model; an accuracy drop of at least FALL from
# the best budget to the largest marks accuracy that falls past the training depth.
AA_PATH_DEPENDENT = 0.9
FALL = 0.05
# The file each run's workdir keeps its chunk-by-chunk fit record in.
FIT_FILE = "study_fit.json"


def _fit_accuracy(workdir: str, split: str, metric: str, step: int) -> float | None:
    """The fit check written at ``step`` (``None`` if the run logged none there)."""
    for record in read_metrics(workdir):
        if record["step"] == step and record["split"] == split and metric in record:
            return float(record[metric])
    return None


def train_until_fit(
    config: Any,
    workdir: str,
    *,
    split: str,
    metric: str,
    chunk_steps: int,
    threshold: float,
    emit: Callable[[str], None] = quiet,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir`` until it fits ``split`` or reaches its step cap.

    Each chunk is one `train_and_evaluate` call stopped at the chunk's last step
    (``train.stop_at_step``; the schedule spans the cap, ``train.steps``), whose periodic
    evaluation (``eval.every_steps = chunk_steps``, at the eval budget, on ``split``) is
    the fit check. A run that fits stops there; a run resumed after an interruption goes
    on from its last checkpoint, and a finished one (its `FIT_FILE` says so) trains no
    more.

    Returns:
      ``dict(fit, steps, train_seconds, fit_accuracy, history, diverged)``: whether
      ``metric >= threshold``, the steps trained, the wall seconds of the training calls
      (compilation included), the last fit check, ``[[step, accuracy], ...]`` and the
      error of a run stopped by non-finite losses (``""`` otherwise). Also written to
      ``{workdir}/study_fit.json``.
    """
    check_run_config(config, workdir)
    path = os.path.join(workdir, FIT_FILE)
    record = dict(fit=False, steps=0, train_seconds=0.0, fit_accuracy=None, history=[])
    record.update(done=False, diverged="")
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    cap = config.train.steps
    while not record["done"]:
        stop = min(record["steps"] + chunk_steps, cap)
        config.train.stop_at_step = stop
        began = time.perf_counter()
        try:
            train_and_evaluate(config, workdir, emit=quiet)
        except NonFiniteLossError as err:
            record.update(done=True, diverged=str(err))
        record["train_seconds"] += time.perf_counter() - began
        if not record["diverged"]:
            accuracy = _fit_accuracy(workdir, split, metric, stop)
            record["history"].append([stop, accuracy])
            record.update(steps=stop, fit_accuracy=accuracy)
            record["fit"] = accuracy is not None and accuracy >= threshold
            record["done"] = record["fit"] or stop >= cap
        emit(f"  step {record['steps']}: {split} {metric} {record['fit_accuracy']}")
        os.makedirs(workdir, exist_ok=True)
        write_json(path, record)
    config.train.stop_at_step = 0
    return record


def read_rows(root: str) -> list[dict[str, Any]]:
    """The rows of the runs finished so far (``[]`` before the first)."""
    path = os.path.join(root, ROWS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _curves(result: dict, metric: str, multipliers, depth: int) -> dict[str, dict[str, float]]:
    """``{split: {"1x": accuracy, ...}}`` from an analysis's test-time curve."""
    by_budget = {max(1, int(round(m * depth))): f"{m}x" for m in multipliers}
    out: dict[str, dict[str, float]] = {}
    for point in result["test_time"]:
        out.setdefault(point["split"], {})[by_budget[point["max_iter"]]] = point[metric]
    return out


def analyse_spec(spec: study.RunSpec, config: Any, scale: study.StudyScale, workdir: str):
    """The analysis part of a row: AA, attacked AA, accuracy per split and budget."""
    metric = study.TASK_SPLITS[spec.task]["metric"]
    target = scale.target_split(spec.task)
    run = setup(config, workdir)
    run.checkpointer.close()
    key = jax.random.key(0)
    result = analysis.analyse_run(
        run, config, target, metric, key, scale.aa_batch, scale.attack_batch, scale.multipliers
    )
    table = result["table"]
    curves = _curves(result, metric, scale.multipliers, spec.depth)
    top = f"{scale.multipliers[-1]}x"
    drops = {split: max(c.values()) - c[top] for split, c in curves.items()}
    return dict(
        aa=table["aa"],
        aa_fit_split=result["aa"][scale.fit_split(spec.task)]["aa"],
        attacked_aa=table["attacked_aa"],
        attacked_accuracy=table["attacked_accuracy"],
        attacked_diverged=table["attacked_diverged"],
        accuracy=table["accuracy"],
        accuracy_by_budget=curves,
        drop_past_depth=drops,
        falls=any(d >= FALL for d in drops.values()),
    )


def study_row(spec: study.RunSpec, scale: study.StudyScale, root: str, emit) -> dict:
    """Trains (until fit or cap) and analyses one run; its row of ``study.jsonl``."""
    workdir = os.path.join(root, spec.task, spec.name)
    config = study.spec_config(spec, scale, os.path.join(root, "data"))
    metric = study.TASK_SPLITS[spec.task]["metric"]
    fit = train_until_fit(
        config,
        workdir,
        split=scale.fit_split(spec.task),
        metric=metric,
        chunk_steps=scale.chunk_steps,
        threshold=scale.fit_threshold,
        emit=emit,
    )
    row = dict(name=spec.name, base=spec.base.name, **dataclasses.asdict(spec))
    row.update({k: fit[k] for k in ("fit", "steps", "train_seconds", "fit_accuracy")})
    row["diverged"] = fit["diverged"]
    if not fit["diverged"]:
        began = time.perf_counter()
        row.update(analyse_spec(spec, config, scale, workdir))
        row["analysis_seconds"] = time.perf_counter() - began
    return row


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _spearman(rows: list[dict[str, Any]]) -> float:
    """Spearman of AA with accuracy over ``rows`` (NaN for fewer than two)."""
    if len(rows) < 2:
        return float("nan")
    return analysis.spearman([r["aa"] for r in rows], [r["accuracy"] for r in rows])


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task: the correlation over fitted runs (and, for comparison, over every
    analysed run), the path-dependent fitted runs, the runs whose accuracy falls, and the
    interventions' effects (see the module docstring)."""
    summary = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        rows_t = [r for r in rows if r["task"] == task]
        analysed = [r for r in rows_t if _finite(r.get("aa"))]
        fitted = [r for r in analysed if r["fit"]]
        by_name = {r["name"]: r for r in rows_t}
        effects = []
        for r in rows_t:
            base = by_name.get(r["base"])
            if not r["intervention"] or base is None or "aa" not in base or "aa" not in r:
                continue
            d_aa, d_acc = r["aa"] - base["aa"], r["accuracy"] - base["accuracy"]
            effects.append(
                dict(
                    base=base["name"],
                    intervention=r["intervention"],
                    aa=[base["aa"], r["aa"]],
                    accuracy=[base["accuracy"], r["accuracy"]],
                    attacked_aa=[base["attacked_aa"], r["attacked_aa"]],
                    together=d_aa * d_acc > 0 or (d_aa == 0 and d_acc == 0),
                )
            )
        summary[task] = dict(
            runs=len(rows_t),
            fit=len(fitted),
            fit_aa_below=sum(r["aa"] < AA_PATH_DEPENDENT for r in fitted),
            spearman=_spearman(fitted),
            spearman_all=_spearman(analysed),
            falls=[r["name"] for r in rows_t if r.get("falls")],
            interventions=effects,
        )
    return summary


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.3f}"
    return "-" if value is None else str(value)


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], scale: study.StudyScale) -> str:
    """The study's tables: one line per run, then the summary and the interventions."""
    mults = [f"{m}x" for m in scale.multipliers]
    lines = []
    for task, s in summary.items():
        target, fit_split = scale.target_split(task), scale.fit_split(task)
        head = ["run", "fit", "steps", "train s", f"{fit_split} 1x", "AA", "attacked AA"]
        head += [f"{target} {m}" for m in mults] + [f"{fit_split} {mults[-1]}"]
        lines += [f"### {task}", "", "| " + " | ".join(head) + " |"]
        lines.append("|" + " --- |" * len(head))
        for r in (r for r in rows if r["task"] == task):
            curves = r.get("accuracy_by_budget", {})
            cells = [r["name"], r["fit"], r["steps"], f"{r['train_seconds']:.0f}"]
            cells += [r["fit_accuracy"], r.get("aa"), r.get("attacked_aa")]
            cells += [curves.get(target, {}).get(m) for m in mults]
            cells.append(curves.get(fit_split, {}).get(mults[-1]))
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines += [
            "",
            f"Spearman(AA, {target} accuracy at {mults[-1]}) over the {s['fit']} runs that "
            f"fit: {_cell(s['spearman'])} (over all {s['runs']} runs: "
            f"{_cell(s['spearman_all'])}); fitted runs with AA < {AA_PATH_DEPENDENT}: "
            f"{s['fit_aa_below']}; accuracy at {mults[-1]} at least {FALL} below the best budget's "
            f"on a split (falls past the training depth): {', '.join(s['falls']) or 'none'}.",
            "",
        ]
        if s["interventions"]:
            lines += ["| base run | intervention | AA | accuracy | attacked AA | together |"]
            lines.append("|" + " --- |" * 6)
            for e in s["interventions"]:
                pair = lambda v: f"{_cell(v[0])} -> {_cell(v[1])}"
                lines.append(
                    f"| {e['base']} | {e['intervention']} | {pair(e['aa'])} | "
                    f"{pair(e['accuracy'])} | {pair(e['attacked_aa'])} | {_cell(e['together'])} |"
                )
            lines.append("")
    return "\n".join(lines)


def enable_compilation_cache(directory: str) -> None:
    """Turns on JAX's persistent compilation cache in ``directory`` unless one is set:
    each chunk of `train_until_fit` is a fresh `train_and_evaluate` call, which would
    otherwise compile the same eval steps again (a train step with host callbacks is
    compiled each time regardless). The command line calls it, not `run_study`: it is
    process-wide."""
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run_study(
    root: str,
    scale: study.StudyScale,
    tasks: tuple[str, ...] = ("prefix_sum", "mazes"),
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs (or resumes) the study in ``root``; returns ``dict(rows, summary, figures)``."""
    os.makedirs(root, exist_ok=True)
    done = {(r["task"], r["name"]) for r in read_rows(root)}
    specs = study.study_specs(scale, tasks)
    for i, spec in enumerate(specs):
        if (spec.task, spec.name) in done:
            continue
        emit(f"[{i + 1}/{len(specs)}] {spec.task}/{spec.name}")
        row = study_row(spec, scale, root, emit)
        emit(f"  {json.dumps({k: row.get(k) for k in ('fit', 'steps', 'aa', 'accuracy')})}")
        with open(os.path.join(root, ROWS_FILE), "a") as f:
            f.write(json.dumps(row) + "\n")
    out = write_summary(root, scale)
    emit(
        f"Wrote {ROWS_FILE}, {SUMMARY_FILE}, {TABLE_FILE} and {', '.join(out['figures'])} in {root}"
    )
    return out


def write_summary(root: str, scale: study.StudyScale) -> dict[str, Any]:
    """Sums up the rows finished so far in ``root`` (a study cut short included): writes
    the summary, the markdown table and the figures; returns ``dict(rows, summary,
    figures)``."""
    rows = read_rows(root)
    summary = summarise(rows)
    write_json(os.path.join(root, SUMMARY_FILE), summary, indent=1)
    write_text(os.path.join(root, TABLE_FILE), markdown(rows, summary, scale))
    figures = plots.write_study_figures(rows, summary, root)
    return dict(rows=rows, summary=summary, figures=figures)
