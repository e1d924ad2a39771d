"""The path-independence report: path-independent vs path-dependent models per task.

For each task, trains (or, when a run's workdir already holds its final checkpoint,
loads) one run per variant, analyses it (or reuses the analysis saved in its workdir)
and writes ``{workdir}/path_independence_report.json`` and PNG figures, after Anil et
al. (2022):

* Table 1 (``table``): per task and variant, the AA score, accuracy, attacked AA and
  attacked accuracy on the task's harder ``target`` split at the largest budget (for
  the regression tasks, edge copy and matrix inversion, the mean squared error).
* Figure 2b (``test_time.png``): accuracy against the test-time iteration budget, per
  split, for each variant.
* Figure 4 (``aa_vs_accuracy.png``): AA against accuracy across every run (the two
  variants of each task plus the ``--sweep`` runs of prefix sums), with the Spearman
  coefficient.
* Figure 5b (``aa_by_correctness.png``): the per-instance AA of correct and incorrect
  predictions.
* ``aa_cost``: the wall time of `model_aa_score` over that of one forward solve on the
  same batch (median of 5 after compilation).

The per-run analysis (`analyse_run`, `aa_cost`, `spearman`, the `TASKS` table) lives in
`experiments.path_independence.analysis`, shared with the study's runner.

Variants: ``path_independent`` is the task config as it is (mixed initialisation and a
solver with Jacobian-free or implicit gradients); ``path_dependent`` trains by "unroll +
backprop" from zeros with a fixed depth (fixed-point iteration, ``full_budget``, the
``unrolled`` backward mode), the setting the paper contrasts.

Usage::

    python -m experiments.path_independence.report --workdir /tmp/pi_report \\
        --tasks=prefix_sum --sweep=6 --sweep_steps=500 --dependent_steps=500

``--study`` runs the study grid instead (`experiments.path_independence.study`: at least 16
prefix-sum and 8 maze models, each trained until it fits or a step cap, then AA, attacked
AA, accuracy at 1x-8x the training depth, Spearman over the fitted models, the
interventions before and after; `experiments.path_independence.runner`), resumable::

    python -m experiments.path_independence.report --workdir /tmp/pis --study \\
        --tasks=prefix_sum,mazes --study_scale=cpu

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import app, flags

from deq_jax.training import NonFiniteLossError
from deq_jax.training.run.writers import write_json
from experiments.path_independence import plots, runner, study
from experiments.path_independence.analysis import (
    ANALYSIS_FILE,
    TASKS,
    aa_cost,
    analyse_run,
    spearman,
    task_config,
)
from launch import flags as launch_flags
from launch.runs import quiet, trained_run

# Flags are defined by `define_flags` when the module runs as a program, so importing it
# next to another report module (both define ``--smoke``) cannot collide.


def define_flags() -> None:
    """Defines this program's flags (``--workdir`` comes from `launch.main`)."""
    flags.DEFINE_list("tasks", ["prefix_sum"], "Tasks to report (keys of TASKS).")
    flags.DEFINE_integer("sweep", len(SWEEP), "Extra prefix-sum runs for the AA-accuracy plot.")
    flags.DEFINE_integer("sweep_steps", 1000, "Train steps of each sweep run.")
    flags.DEFINE_integer(
        "dependent_steps", 0, "Train steps of the path-dependent run (0: the config's)."
    )
    flags.DEFINE_integer("aa_batch", 100, "Examples per split for the AA scores.")
    flags.DEFINE_integer("attack_batch", 32, "Examples attacked per run.")
    flags.DEFINE_boolean("smoke", False, "Tiny runs (the configs' smoke variants).")
    flags.DEFINE_boolean(
        "study", False, "Run the study grid (experiments.path_independence.study) instead."
    )
    flags.DEFINE_enum(
        "study_scale", "cpu", ["cpu", "gpu"], "Sizes of the study runs (--smoke: tiny ones)."
    )


REPORT_FILE = "path_independence_report.json"
# Unroll + backprop from zeros at a fixed depth of 8, without the cell's layer norm.
# Depth 8 is near the least at which the default cell (five width-3 convolutions per
# iteration) sees all 32 bits (8 x 5 = 40 >= 31 positions), so training leans on the
# transient; at depth 10, or 15 with or without layer norm, the prefix-sum map trained
# this way is path independent anyway (see BUILD_NOTES.md).
PATH_DEPENDENT = {
    "deq.z_init": "zeros",
    "model.norm": "",
    "deq.solver.name": "fixed_point_iteration",
    "deq.solver.full_budget": True,
    "deq.backward.name": "unrolled",
    "deq.train_max_iter": 8,
}
# The sweep for Figure 4: interventions and normalisation on and off, so AA spreads out.
_FIXED_DEPTH = {"deq.solver.name": "fixed_point_iteration", "deq.solver.full_budget": True}
SWEEP = (
    {**PATH_DEPENDENT, "model.norm": "layer"},
    {"model.norm": "", "deq.z_init": "mixed"},
    {"model.norm": "", "deq.z_init": "zeros"},
    {"model.norm": "", "deq.z_init": "zeros", "deq.train_max_iter": 15, **_FIXED_DEPTH},
    {"path_independence.budget_max": 40, "path_independence.budget_min": 10},
    {"deq.z_init": "normal", "path_independence.alignment_weight": 1.0},
)


def run_report(
    root: str,
    tasks: Sequence[str],
    *,
    sweep: int,
    sweep_steps: int,
    dependent_steps: int = 0,
    smoke: bool = False,
    aa_batch: int = 100,
    attack_batch: int = 32,
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trains/loads every run, analyses it and writes the JSON report and figures."""
    report: dict[str, Any] = {"tasks": {}, "runs": []}
    key = jax.random.key(0)
    for task in tasks:
        spec = TASKS[task]
        variants = {"path_independent": {}, "path_dependent": dict(PATH_DEPENDENT)}
        if task == "prefix_sum":
            for i, overrides in enumerate(SWEEP[:sweep]):
                variants[f"sweep_{i}"] = {**overrides, "train.steps": sweep_steps}
        section = {}
        for name, overrides in variants.items():
            overrides = dict(overrides)
            if dependent_steps and name == "path_dependent":
                overrides["train.steps"] = dependent_steps
            config = task_config(task, overrides, smoke)
            workdir = os.path.join(root, task, name)
            emit(f"[{task}/{name}] training or loading in {workdir}")
            t0 = time.time()
            try:
                run = trained_run(config, workdir, emit=quiet)
            except NonFiniteLossError as err:  # a diverged variant is a result too
                emit(f"[{task}/{name}] diverged: {err}")
                section[name] = dict(diverged=str(err), overrides=overrides)
                continue
            target = spec["target"] or run.task.eval_splits[-1]
            cached = os.path.join(workdir, ANALYSIS_FILE)
            if os.path.exists(cached):  # analysed before: the run's checkpoint is final
                with open(cached) as f:
                    result = json.load(f)
            else:
                result = analyse_run(
                    run, config, target, spec["metric"], key, aa_batch, attack_batch
                )
                write_json(cached, result, default=str)
            result["overrides"] = {k: v for k, v in overrides.items()}
            section[name] = result
            row = dict(task=task, variant=name, **result["table"])
            report["runs"].append(row)
            emit(f"[{task}/{name}] {json.dumps(result['table'])} ({time.time() - t0:.0f} s)")
            if name == "path_independent":
                section["aa_cost"] = aa_cost(run, target, aa_batch)
                emit(f"[{task}] aa_score cost: {json.dumps(section['aa_cost'])}")
        report["tasks"][task] = section
    # Accuracies only: a regression task's "accuracy" is an error, lower is better.
    runs = [r for r in report["runs"] if TASKS[r["task"]]["metric"] != "mse"]
    report["spearman"] = spearman([r["aa"] for r in runs], [r["accuracy"] for r in runs])
    emit(f"Spearman(AA, accuracy) over {len(runs)} runs: {report['spearman']:.3f}")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, REPORT_FILE)
    write_json(path, report, indent=1, default=str)
    report["figures"] = plots.write_figures(report, root)
    write_json(path, report, indent=1, default=str)
    emit(f"Wrote {path} and {', '.join(report['figures'])}")
    return report


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    workdir, flag = launch_flags.WORKDIR.value, flags.FLAGS
    for task in flag.tasks:
        if task not in TASKS:
            raise app.UsageError(f"Unknown task {task!r}. Valid tasks: {', '.join(TASKS)}.")
    if flag.study:
        scale = study.SCALES["smoke" if flag.smoke else flag.study_scale]
        emit = lambda line: print(line, flush=True)
        runner.enable_compilation_cache(os.path.join(workdir, "jax_cache"))
        runner.run_study(workdir, scale, tuple(flag.tasks), emit=emit)
        return
    run_report(
        workdir,
        flag.tasks,
        sweep=flag.sweep,
        sweep_steps=flag.sweep_steps,
        dependent_steps=flag.dependent_steps,
        smoke=flag.smoke,
        aa_batch=flag.aa_batch,
        attack_batch=flag.attack_batch,
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["workdir"])  # --workdir is launch.main's flag
    app.run(main)
