"""`train_and_evaluate(config, workdir)`: the training loop, from start-up to the report.

One call builds everything from the config (`deq_jax.training.build`), restores the
latest checkpoint of the workdir if there is one, trains to ``config.train.steps``
with the data iterator resumed at the restored step, logs and evaluates periodically,
saves checkpoints, keeps the state with the best validation score besides the last
(`deq_jax.training.selection`: scored after each periodic evaluation and at the end),
and ends with the per-length accuracy report of that best state at several multiples
of the train budget (printed split by split as it runs, and written to
``length_generalization.json`` with the step it scored, ``best``). A finished workdir
run again with the same ``train.steps`` says so and writes nothing; with a larger one
it continues. A task without ``num_classes`` is trained as a regression (mean squared
error), and the ``regularizer`` section adds the Jacobian regulariser and logs the
spectral radius (`deq_jax.training.regularizer`); ``neural_solver.alternating``
interleaves neural-solver fits with the DEQ's training (`deq_jax.training.alternating`).
``train.ema_decay > 0`` keeps a moving average of the weights (`deq_jax.training.optim`),
which evaluation, selection and the report score; ``eval.score_raw_weights`` also scores
the raw weights at each periodic evaluation (``{split}_raw``, never selected on).

Files in the workdir: ``checkpoints/`` (orbax), ``checkpoints_best/`` (the best
state and its record), ``metrics.jsonl``, ``tensorboard/``,
``length_generalization.json`` (with ``train_seconds``, the wall time of the training
loop, summed over the invocations that continued a finished run), ``config.json`` and
``data/`` (generated data, unless ``task.data_dir`` is set).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import jax
import numpy as np

from deq_jax.training import evaluate
from deq_jax.training.alternating import AlternatingSolver
from deq_jax.training.interventions import PathIndependence
from deq_jax.training.metrics import is_regression
from deq_jax.training.nonfinite import (  # NonFiniteLossError: re-exported for callers
    SKIPPED,
    NonFiniteLossError,  # noqa: F401
    NonFiniteSteps,
    logged,
)
from deq_jax.training.regularizer import JacobianRegularizer
from deq_jax.training.selection import BestCheckpoint, SelectionRule
from deq_jax.training.settle import SettleRule
from deq_jax.training.setup import setup
from deq_jax.training.solver_fit import NeuralSolverSpec
from deq_jax.training.state import TrainState
from deq_jax.training.steps import make_spectral_step, make_train_step
from deq_jax.training.writers import MetricWriter, ProgressLogger, read_metrics, write_text


class RunResult(NamedTuple):
    """What `train_and_evaluate` returns.

    Attributes:
      state: the final train state (replicated over the mesh).
      step: the step training stopped at.
      eval_metrics: ``{split: metrics}`` of the last evaluation at the eval budget (at
        the end of training: of the best checkpoint, which the report scores).
      report: ``{budget: {split: metrics}}`` of the final per-length report of the
        best checkpoint (``{}`` when the run stopped early through
        ``train.stop_at_step``).
    """

    state: TrainState
    step: int
    eval_metrics: dict[str, dict]
    report: dict[str, dict[str, dict]]


# Train metrics present on some steps only (NaN or absent elsewhere): averaged over the
# steps that have them, and left out of an interval that has none.
SPARSE_METRICS = ("jacobian_term", "spectral_radius")
# Train metrics summed over an interval (the count of skipped non-finite steps).
SUMMED_METRICS = (SKIPPED,)


def interval_mean(
    history: list[dict[str, Any]], sparse: Collection[str] | None = SPARSE_METRICS
) -> dict[str, float]:
    """Averages per-step train metrics over a logging interval (``*_max`` by max, the
    `SUMMED_METRICS` by sum).

    The ``sparse`` metrics (``None``: every metric) count only where they are finite,
    and a sparse metric with no finite value in the interval is left out.
    """
    out = {}
    keys = list(dict.fromkeys(k for m in history for k in m))
    for key in keys:
        values = [float(m[key]) for m in history if key in m]
        if sparse is None or key in sparse:
            values = [v for v in values if math.isfinite(v)]
            if not values:
                continue
        if key in SUMMED_METRICS:
            out[key] = float(np.sum(values))
        else:
            out[key] = max(values) if key.endswith("_max") else float(np.mean(values))
    return out


# The config a run was trained under, written into its workdir at every start.
CONFIG_FILE = "config.json"


def config_json(config: Any) -> str:
    """``config`` as the JSON text of a run's `CONFIG_FILE` (tuples become lists)."""
    if hasattr(config, "to_json_best_effort"):
        return config.to_json_best_effort(indent=2)
    return json.dumps(dict(config), indent=2, default=str)


def _write_config(config: Any, workdir: str) -> None:
    write_text(os.path.join(workdir, CONFIG_FILE), config_json(config))


def earlier_report(workdir: str, report_file: str, start: int) -> dict | None:
    """The report a run wrote at or before its restored step ``start`` (a run resumed
    with a larger ``train.steps`` adds its ``train_seconds`` to the new run's), or
    ``None``: no report, or one written after ``start`` (a later run's, not continued)."""
    path = os.path.join(workdir, report_file)
    if not start or not os.path.exists(path):
        return None
    with open(path) as f:
        previous = json.load(f)
    return previous if previous.get("step", start + 1) <= start else None


def run_is_finished(
    previous: dict | None,
    workdir: str,
    report_file: str,
    start: int,
    steps: int,
    ckpt: Any,
    emit: Callable[[str], None],
) -> bool:
    """Whether the run is finished: it restored step ``start >= steps`` and ``previous``
    (its `earlier_report`) was written at that step; then ``ckpt`` is closed and one
    line says so. Both training loops (this one and the language model's) ask this
    before writing anything.
    """
    if start < steps or previous is None or previous.get("step") != start:
        return False
    ckpt.close()
    emit(
        f"The run in {workdir} is finished (step {start}, train.steps={steps}); its report "
        f"is {os.path.join(workdir, report_file)}. Nothing was run or written. Raise "
        "--config.train.steps to train further, or use a fresh --workdir."
    )
    return True


def _finished_result(workdir: str, splits, state: TrainState, step: int, report: dict):
    """The `RunResult` of a finished run: its saved ``report`` and the evaluation of
    ``splits`` at ``step`` that its ``metrics.jsonl`` holds."""
    eval_metrics = {}
    for record in read_metrics(workdir):
        if record["step"] == step and record["split"] in splits:
            eval_metrics[record["split"]] = {
                k: v for k, v in record.items() if k not in ("step", "split")
            }
    return RunResult(state=state, step=step, eval_metrics=eval_metrics, report=report)


def _warmup_step(model, pretrain_steps: int, task, run, mesh, regression: bool):
    """The train step of the first ``train.pretrain_steps`` steps: the same parameters
    run as the explicit weight-tied network (the model's ``mode="weight_tied"``), with
    neither the Jacobian term nor the path-independence interventions (there is no
    fixed point yet); ``None`` without a warm-up.

    Raises:
      ValueError: for a warm-up of a model without a ``"weight_tied"`` mode.
    """
    if not pretrain_steps:
        return None
    if not hasattr(model, "mode"):
        raise ValueError(
            f"train.pretrain_steps={pretrain_steps} runs a weight-tied warm-up, which "
            f"{type(model).__name__} does not have (models with a mode='weight_tied': "
            "mdeq, deq_transformer_lm); set train.pretrain_steps=0."
        )
    return make_train_step(
        model.clone(mode="weight_tied"),
        task.metrics,
        run.schedule,
        mesh,
        regression=regression,
        extras=task.batch_extras,
        loss_fn=getattr(task, "loss", None),
    )


def train_and_evaluate(
    config: Any, workdir: str, *, emit: Callable[[str], None] = print
) -> RunResult:
    """Trains and evaluates the model the config describes, in ``workdir``.

    Args:
      config: an `ml_collections.ConfigDict` with the sections of
        ``configs/default.py`` (task, model, solver, backward, train, eval, ckpt, log).
      workdir: where checkpoints, metrics, TensorBoard events and the report go; a
        workdir with checkpoints is resumed from the latest one.
      emit: receives every human-readable line (progress, evaluation, report).

    Returns:
      A `RunResult`.

    Raises:
      ValueError: for an invalid config (unknown names list the valid ones; a batch
        size that does not split over the devices names the device count).
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
      NonFiniteLossError: after ``train.max_nonfinite_steps`` steps in a row with a
        non-finite loss or gradient norm (each one skipped, logged and counted as
        ``skipped_steps``); the message names the steps and the last good checkpoint,
        which is kept.
    """
    tc = config.train
    regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
    interventions = PathIndependence.from_config(config.get("path_independence", {}))
    run = setup(config, workdir)
    mesh, task, model, state, start = run.mesh, run.task, run.model, run.state, run.start_step
    ckpt = run.checkpointer
    lead = jax.process_index() == 0
    previous = earlier_report(workdir, evaluate.REPORT_FILE, start)
    if run_is_finished(previous, workdir, evaluate.REPORT_FILE, start, tc.steps, ckpt, emit):
        splits = tuple(config.eval.splits) or tuple(task.eval_splits)
        return _finished_result(workdir, splits, state, start, previous["report"])
    if lead:
        _write_config(config, workdir)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    emit(
        f"{model.__class__.__name__}: {n_params} parameters, {mesh.devices.size} device(s), "
        f"{'resuming from step ' + str(start) if start else 'starting from scratch'}; "
        f"workdir {workdir}"
    )

    regression = is_regression(task)
    spectral_every = regularizer.spectral_every

    def build_steps(model):
        train_step = make_train_step(
            model,
            task.metrics,
            run.schedule,
            mesh,
            regression=regression,
            regularizer=regularizer,
            interventions=interventions,
            extras=task.batch_extras,
            loss_fn=getattr(task, "loss", None),
        )
        spectral_step = make_spectral_step(
            model, mesh, regularizer.spectral_iters, extras=task.batch_extras
        )
        evaluator = evaluate.Evaluator(
            model,
            task,
            mesh,
            config.eval.batch_size,
            max_batches=config.eval.max_batches,
            settle=SettleRule.from_config(config.deq),
        )
        return train_step, spectral_step, evaluator

    train_step, spectral_step, evaluator = build_steps(model)
    warmup_step = _warmup_step(model, tc.get("pretrain_steps", 0), task, run, mesh, regression)
    solver_spec = NeuralSolverSpec.from_run_config(config)
    alternating = None
    if solver_spec.alternating:
        alternating = AlternatingSolver(solver_spec, model, task, emit)
    eval_splits = tuple(config.eval.splits) or tuple(task.eval_splits)
    writer = MetricWriter(workdir, tensorboard=config.log.tensorboard, enabled=lead)
    total = tc.steps
    stop = min(tc.stop_at_step, total) if tc.stop_at_step else total
    progress = ProgressLogger(total, start, emit=emit)
    batches = task.train_iterator(
        tc.batch_size,
        seed=tc.seed,
        start_step=start,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )

    def run_eval(step: int, full: bool, scored: TrainState | None = None, splits=()) -> dict:
        """``splits`` (or ``eval.splits``) of ``scored`` (or the state) at ``step``."""
        if full:
            evaluator.max_batches = 0
        results = {}
        weights = evaluate.weights_to_score(state if scored is None else scored, config.eval)
        for split in splits or eval_splits:
            for suffix, scored_weights in weights.items():
                metrics = evaluator.evaluate(scored_weights, split)
                results.setdefault(split, metrics)  # the average's (or the only weights')
                writer.write(step, split + suffix, metrics)
                emit(f"eval step {step} {split + suffix}: {evaluate.short_metrics(metrics)}")
        progress.restart_clock(step)
        return results

    def select(step: int, results: dict[str, dict]) -> None:
        """Offers ``state`` to the best checkpoint, scored on the selection split as
        the periodic evaluation scores it (its split evaluated if ``results`` lack it)."""
        evaluator.max_batches = config.eval.max_batches
        metrics = results.get(best.rule.split) or evaluator.evaluate(state, best.rule.split)
        best.offer(step, state, best.rule.score(metrics))

    nonfinite = NonFiniteSteps(
        tc.get("max_nonfinite_steps", 1),  # 1: a config written before the key stops as it did
        ckpt,
        emit,
        "Lower train.learning_rate, tighten train.grad_clip_norm or make the cell more "
        "contractive.",
    )
    history: list[dict[str, Any]] = []
    eval_metrics: dict[str, dict] = {}
    best = BestCheckpoint(workdir, SelectionRule.from_config(config.eval, task), emit)
    began = time.perf_counter()
    try:
        for step in range(start + 1, stop + 1):
            if alternating is not None and alternating.due(step, start):
                train_step, spectral_step, evaluator = build_steps(alternating.refresh(state))
                progress.restart_clock(step)
            batch = evaluate.device_batch(next(batches), mesh, task.batch_extras)
            if spectral_every and (step - 1) % spectral_every == 0:
                spectral = jax.device_get(spectral_step(state, batch))
            else:
                spectral = {}
            warming = warmup_step is not None and step <= tc.pretrain_steps
            state, metrics = (warmup_step if warming else train_step)(state, batch)
            if warming and step == tc.pretrain_steps:
                emit(f"step {step}: weight-tied warm-up done; solving for the fixed point now")
            metrics = {**jax.device_get(metrics), **spectral}
            skipped = nonfinite.skipped(metrics, step)
            history.append(logged(metrics, skipped))
            if step == start + 1:
                progress.restart_clock(step)
            if step % config.log.every_steps == 0 or step == stop:
                mean = interval_mean(history)
                writer.write(step, "train", mean)
                progress.line(step, mean)
                history = []
            if config.eval.every_steps and step % config.eval.every_steps == 0 and step < total:
                eval_metrics = run_eval(step, full=False)
                select(step, eval_metrics)
            if not skipped:  # the latest checkpoint stays the last good one
                ckpt.maybe_save(step, state)
        last_step = max(stop, start)
        ckpt.maybe_save(last_step, state, force=True)
        ckpt.wait()
        train_seconds = time.perf_counter() - began
        if previous is not None:
            train_seconds += previous.get("train_seconds") or 0.0
        report: dict[str, dict[str, dict]] = {}
        if last_step >= total:
            select(last_step, {})
            scored = state if best.step in (None, last_step) else best.restore(state)
            same = evaluate.eval_budget_name(config)
            eval_budget = config.deq.eval_max_iter or config.deq.train_max_iter
            emit(
                f"Final evaluation at step {last_step} of {best.describe()}: "
                + ("" if same else f"the eval budget ({eval_budget} iterations), then ")
                + f"budgets {evaluate.report_budgets(config)}, a line per split:"
            )
            if not same:
                eval_metrics = run_eval(last_step, full=True, scored=scored)
            report = evaluate.final_report(
                config, evaluator, scored, task.eval_splits, writer, emit, last_step
            )
            if lead:
                extra = dict(
                    step=last_step, budgets=evaluate.report_budgets(config), best=best.record
                )
                path = evaluate.write_report(
                    workdir, report, {**extra, "train_seconds": train_seconds}
                )
                emit(f"Wrote {path}")
            if same:
                eval_metrics = {s: report[same][s] for s in eval_splits if s in report[same]}
                for split, metrics in eval_metrics.items():
                    writer.write(last_step, split, metrics)
                if missing := tuple(s for s in eval_splits if s not in report[same]):
                    eval_metrics.update(run_eval(last_step, True, scored, missing))  # valid
    finally:
        ckpt.close()
        best.close()
        writer.close()
    return RunResult(state=state, step=last_step, eval_metrics=eval_metrics, report=report)
