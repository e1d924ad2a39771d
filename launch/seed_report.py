"""One config trained once per train seed, each seed evaluated, and the mean and
standard deviation over seeds: the three-seed table behind a headline number.

For each seed ``k`` of ``--seeds``, ``{workdir}/seed{k}`` holds the run of the config
with ``train.seed=k`` (trained, resumed, or loaded when finished: `launch.runs`); its
checkpoint (``--checkpoint``: the best on validation by default, else the last) is
evaluated on ``--splits`` at the solver budgets ``--max_iters``
(`deq_jax.training.evaluate_checkpoint`; defaults: the task's eval splits at the
config's budget multipliers). Writes ``{workdir}/seed_report.json`` (every seed's
metrics, the checkpoint step it scored, and the summary) and ``seed_report.md``, and
prints, per metric of ``--metrics`` (default: the task's selection metric and the mean
solver steps), a table with a row per split and budget, a column per seed and the mean
+- standard deviation (population, `launch.seeds.mean_std`).

Usage::

    python -m launch.seed_report --config configs/mazes.py:benchmark \\
        --workdir /tmp/mazes_seeds --seeds=0,1,2 \\
        --splits=test_13,test_15,test_21 --max_iters=30,60,120 [--checkpoint=last]

``--config.<key>=...`` overrides apply to every seed's run (``train.seed`` is set per
seed); a workdir already holding a run of another config is refused
(`launch.runs.RunConfigMismatchError`).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from launch import flags as launch_flags
from launch import seeds
from launch.runs import quiet, trained_run, write_report

REPORT = "seed_report"


def define_flags() -> None:
    """Defines this program's flags (``--config`` and ``--workdir`` are `launch.main`'s)."""
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Train seeds: one run per seed.")
    launch_flags.define_splits_flag()
    flags.DEFINE_list("max_iters", [], "Solver budgets (default: the budget multipliers).")
    flags.DEFINE_enum(
        "checkpoint", "best", ["best", "last"], "Which checkpoint of each run to score."
    )
    flags.DEFINE_list(
        "metrics", [], "Metrics to tabulate (default: the task's selection metric, nstep_mean)."
    )


def seed_rows(
    config: Any,
    root: str,
    train_seeds: Sequence[int],
    *,
    splits: Sequence[str] = (),
    max_iters: Sequence[int] = (),
    checkpoint: str = "best",
    emit: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], str]:
    """Trains or loads the run of each seed and evaluates it.

    Returns:
      One row per seed, split and budget, ``{"seed", "split", "budget", "step",
      **metrics}`` (``step``: the checkpoint scored), and the task's selection metric
      (`deq_jax.tasks.Task.selection_metric`).
    """
    from deq_jax.training import evaluate_checkpoint
    from deq_jax.training.families.evaluate import short_metrics
    from deq_jax.training.run.selection import read_best_record

    rows, task_metric = [], ""
    for seed in train_seeds:
        workdir = seeds.seed_workdir(root, seed)
        run_config = copy.deepcopy(config)
        run_config.train.seed = seed
        emit(f"[seed {seed}] training or loading in {workdir}")
        run = trained_run(run_config, workdir, emit=emit)
        task_metric = run.task.selection_metric[0]
        best = read_best_record(workdir)
        step = best["step"] if checkpoint == "best" and best else run.start_step
        report = evaluate_checkpoint(
            run_config, workdir, splits, max_iters, emit=quiet, checkpoint=checkpoint, run=run
        )
        for budget, by_split in report.items():
            for split, metrics in by_split.items():
                row = dict(seed=seed, split=split, budget=budget, step=step)
                row.update({k: float(v) for k, v in metrics.items()})
                rows.append(row)
                emit(f"[seed {seed}] {budget} {split}: " + short_metrics(metrics))
    return rows, task_metric


def markdown(rows: Sequence[dict[str, Any]], summary: Sequence[dict], metric: str) -> str:
    """A table of ``metric``: a row per split and budget, a column per seed, then the
    mean +- std over seeds."""
    train_seeds = sorted({r["seed"] for r in rows})
    by_key = {(r["split"], r["budget"], r["seed"]): r for r in rows}
    head = ["split", "budget", *[f"seed {s}" for s in train_seeds], "mean ± std"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for group in summary:
        cells = [group["split"], group["budget"]]
        for seed in train_seeds:
            value = by_key.get((group["split"], group["budget"], seed), {}).get(metric)
            cells.append("-" if value is None else f"{value:.4f}")
        cells.append(seeds.format_mean_std(group, metric, digits=4))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_report(
    config: Any,
    root: str,
    train_seeds: Sequence[int],
    *,
    splits: Sequence[str] = (),
    max_iters: Sequence[int] = (),
    checkpoint: str = "best",
    metrics: Sequence[str] = (),
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`seed_rows`, their mean and std over seeds (`launch.seeds.aggregate`), written
    as ``{root}/seed_report.json`` and ``.md``; returns the JSON's content."""
    rows, task_metric = seed_rows(
        config,
        root,
        train_seeds,
        splits=splits,
        max_iters=max_iters,
        checkpoint=checkpoint,
        emit=emit,
    )
    metrics = list(metrics) or [task_metric, "nstep_mean"]
    missing = [m for m in metrics if not any(m in r for r in rows)]
    if missing:
        reported = sorted({k for r in rows for k in r} - {"seed", "split", "budget", "step"})
        raise ValueError(f"--metrics {missing} are not reported; valid: {', '.join(reported)}.")
    summary = seeds.aggregate(rows, ("split", "budget"), metrics)
    text = f"Train seeds {list(train_seeds)}, {checkpoint} checkpoint of each run.\n"
    for metric in metrics:
        text += f"\n{metric}:\n\n" + markdown(rows, summary, metric)
    report = dict(seeds=list(train_seeds), checkpoint=checkpoint, rows=rows, summary=summary)
    emit(text)
    write_report(os.path.join(root, f"{REPORT}.json"), report, text, emit=emit)
    return report


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    flag = flags.FLAGS
    try:
        train_seeds = seeds.parse_seeds(flag.seeds)
        max_iters = [int(k) for k in flag.max_iters]
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    run_report(
        launch_flags.checked_config(),
        launch_flags.WORKDIR.value,
        train_seeds,
        splits=flag.splits,
        max_iters=max_iters,
        checkpoint=flag.checkpoint,
        metrics=flag.metrics,
        emit=functools.partial(print, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    launch_flags.run(main)
