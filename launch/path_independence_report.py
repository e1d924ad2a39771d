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

Variants: ``path_independent`` is the task config as it is (mixed initialisation and a
solver with Jacobian-free or implicit gradients); ``path_dependent`` trains by "unroll +
backprop" from zeros with a fixed depth (fixed-point iteration, ``full_budget``, the
``unrolled`` backward mode), the setting the paper contrasts.

Usage::

    python -m launch.path_independence_report --workdir /tmp/pi_report \\
        --tasks=prefix_sum --sweep=6 --sweep_steps=500 --dependent_steps=500

``--study`` runs the study grid instead (`launch.path_independence_study`: at least 16
prefix-sum and 8 maze models, each trained until it fits or a step cap, then AA, attacked
AA, accuracy at 1x-8x the training depth, Spearman over the fitted models, the
interventions before and after; `launch.path_independence_runner`), resumable::

    python -m launch.path_independence_report --workdir /tmp/pis --study \\
        --tasks=prefix_sum,mazes --study_scale=cpu

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from deq_jax import analysis
from deq_jax.training import NonFiniteLossError
from deq_jax.training.writers import write_json
from launch import main as launch_main
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
        "study", False, "Run the study grid (launch.path_independence_study) instead."
    )
    flags.DEFINE_enum(
        "study_scale", "cpu", ["cpu", "gpu"], "Sizes of the study runs (--smoke: tiny ones)."
    )


REPORT_FILE = "path_independence_report.json"
# Each run's analysis, kept in its workdir so a rerun of the report reuses it.
ANALYSIS_FILE = "path_independence_analysis.json"

# Per task: its config module, the harder split of Table 1, the whole-answer metric and
# the test-time budgets (multiples of the train budget) of Figure 2b.
TASKS = {
    "prefix_sum": dict(
        config="prefix_sum",
        overrides={"task.test_lengths": (32, 64, 128)},
        target="test_128",
        metric="string_accuracy",
    ),
    "mazes": dict(config="mazes", overrides={}, target="test_13", metric="maze_accuracy"),
    "blurry_digits": dict(config="blurry_digits", overrides={}, target=None, metric="accuracy"),
    # Regression: "accuracy" is the mean squared error (lower is better), "correct" the
    # better half of each batch.
    "edge_copy": dict(config="edge_copy", overrides={}, target=None, metric="mse"),
    "matrix_inversion": dict(config="matrix_inversion", overrides={}, target=None, metric="mse"),
}
BUDGET_MULTIPLIERS = (0.5, 1, 2, 4, 8)

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


def task_config(task: str, overrides: dict[str, Any], smoke: bool = False) -> Any:
    """The task's config (``configs/<name>.py``) with ``"section.field"`` overrides."""
    spec = TASKS[task]
    module = importlib.import_module(f"configs.{spec['config']}")
    config = module.get_config("smoke" if smoke else None)
    for key, value in {**spec["overrides"], **overrides}.items():
        *sections, field = key.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[field] = value
    return config


def _budgets(config: Any, multipliers: Sequence[float] = BUDGET_MULTIPLIERS) -> list[int]:
    base = config.deq.train_max_iter
    return sorted({max(1, int(round(m * base))) for m in multipliers})


def _batch(run: Any, split: str, size: int) -> dict[str, np.ndarray]:
    """The first ``size`` real examples of ``split``, as one host batch."""
    batch = next(iter(run.task.eval_iterator(split, size)))
    keep = np.asarray(batch["mask"], bool)
    return {k: np.asarray(v)[keep] for k, v in batch.items()}


def _whole_correct(outputs: Any, targets: Any, regression: bool = False) -> np.ndarray:
    """``[B]`` bool: every label of the example right (classification); for a
    regression task, a squared error below the batch median (the better half)."""
    if regression:
        err = np.square(np.asarray(outputs) - np.asarray(targets))
        err = err.reshape(err.shape[0], -1).mean(axis=1)
        return err <= np.median(err)
    right = np.asarray(jnp.argmax(outputs, axis=-1)) == np.asarray(targets)
    return right.reshape(right.shape[0], -1).all(axis=1)


def _attacked_metric(outputs: Any, targets: Any, regression: bool) -> float:
    """Whole-answer accuracy of the attacked outputs, or their mean squared error."""
    if regression:
        return float(np.mean(np.square(np.asarray(outputs) - np.asarray(targets))))
    return float(np.mean(_whole_correct(outputs, targets)))


def analyse_run(
    run: Any,
    config: Any,
    target: str,
    metric: str,
    key: jax.Array,
    aa_batch: int = 100,
    attack_batch: int = 32,
    multipliers: Sequence[float] = BUDGET_MULTIPLIERS,
) -> dict:
    """Test-time curve (at ``multipliers`` times the train budget), AA per split (at the
    largest), Table 1 row and per-instance AA of one run."""
    from deq_jax.training import evaluate

    model, variables = run.model, run.state.variables()
    regression = getattr(run.task, "num_classes", None) is None
    budgets = _budgets(config, multipliers)
    evaluator = evaluate.Evaluator(
        model, run.task, run.mesh, config.eval.batch_size, max_batches=config.eval.max_batches
    )
    curve = []
    for split in run.task.eval_splits:
        for budget in budgets:
            m = evaluator.evaluate(run.state, split, budget)
            curve.append(dict(split=split, max_iter=budget, **m))
    top = budgets[-1]
    extra_keys = tuple(getattr(run.task, "batch_extras", ()))
    aa = {}
    for i, split in enumerate(run.task.eval_splits):
        b = _batch(run, split, aa_batch)
        kwargs = {k: jnp.asarray(b[k]) for k in extra_keys}
        rngs = {"z0": jax.random.fold_in(key, 2 * i)}
        inputs = jnp.asarray(b["inputs"])
        call = analysis.deq_call(model, variables, inputs, max_iter=top, rngs=rngs, **kwargs)
        mean, per = analysis.model_aa_score(
            model,
            variables,
            inputs,
            key=jax.random.fold_in(key, 2 * i + 1),
            max_iter=top,
            first=call,
            **kwargs,
        )
        aa[split] = dict(
            aa=float(mean),
            per_instance=np.asarray(per).tolist(),
            correct=_whole_correct(call.outputs, b["targets"], regression).tolist(),
        )
    b = _batch(run, target, attack_batch)
    kwargs = {k: jnp.asarray(b[k]) for k in extra_keys}
    attack, attacked_out = analysis.model_adversarial_aa(
        model,
        variables,
        jnp.asarray(b["inputs"]),
        key=jax.random.fold_in(key, 99),
        max_iter=top,
        rngs={"z0": jax.random.fold_in(key, 98)},
        model_kwargs=kwargs,
        steps=config.deq.train_max_iter,
        restarts=2,
        lbfgs_iters=10,
    )
    at_target = next(r for r in curve if r["split"] == target and r["max_iter"] == top)
    table = dict(
        aa=aa[target]["aa"],
        accuracy=at_target[metric],
        attacked_aa=float(attack.aa),
        attacked_diverged=float(np.mean(np.asarray(attack.diverged))),
        attacked_accuracy=_attacked_metric(attacked_out, b["targets"], regression),
        split=target,
        max_iter=top,
    )
    return dict(table=table, test_time=curve, aa=aa)


def aa_cost(run: Any, split: str, aa_batch: int = 100, repeats: int = 5) -> dict[str, float]:
    """Median seconds of `model_aa_score` and of one forward solve, and their ratio."""
    model, variables = run.model, run.state.variables()
    b = _batch(run, split, aa_batch)
    x = jnp.asarray(b["inputs"])
    kw = {k: jnp.asarray(b[k]) for k in getattr(run.task, "batch_extras", ())}
    rngs, key = {"z0": jax.random.key(0)}, jax.random.key(1)
    forward = jax.jit(lambda v, x: model.apply(v, x, train=False, rngs=rngs, **kw)[0])
    score = jax.jit(lambda v, x: analysis.model_aa_score(model, v, x, key=key, rngs=rngs, **kw)[0])

    def median_time(fn):
        jax.block_until_ready(fn(variables, x))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(variables, x))
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    t_fwd, t_aa = median_time(forward), median_time(score)
    return dict(forward_s=t_fwd, aa_s=t_aa, ratio=t_aa / t_fwd, split=split)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


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
    from launch import path_independence_plots as plots

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
    launch_main.reject_arguments(argv)
    launch_main.quiet_library_logs()
    workdir, flag = launch_main._WORKDIR.value, flags.FLAGS
    for task in flag.tasks:
        if task not in TASKS:
            raise app.UsageError(f"Unknown task {task!r}. Valid tasks: {', '.join(TASKS)}.")
    if flag.study:
        from launch import path_independence_runner as runner
        from launch import path_independence_study as study

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
