"""`train_and_evaluate(config, workdir)`: the one training loop, from start-up to the report.

Every task family runs this loop, the language model included; a `Family`
(`deq_jax.training.families.family`) brings what differs: its set-up, its train step and the
carry threaded between steps (the language model's segment memory), its evaluator and
its final report. `family_for` picks the family from the config: the language model
(``model.name="deq_transformer_lm"``, `deq_jax.training.families.lm_family`) or every other task
(`deq_jax.training.families.task_family`).

One call builds everything from the config, restores the latest checkpoint of the
workdir if there is one, trains to ``config.train.steps`` with the data iterator
resumed at the restored step, logs and evaluates periodically, saves checkpoints, keeps
the state with the best validation score besides the last (`deq_jax.training.run.selection`:
scored after each periodic evaluation past the warm-up, and at the end) and ends with
the family's final report of that best state. The first ``train.pretrain_steps`` steps
train the same parameters as the explicit weight-tied network (the model's
``mode="weight_tied"``), which the periodic evaluation then scores and which is never
selected. A step with a non-finite loss or gradient norm is skipped and logged; after
``train.max_nonfinite_steps`` in a row the run stops. A finished workdir run again with
the same ``train.steps`` says so and writes nothing; with a larger one it continues.

A workdir holds one live run (`deq_jax.training.run.workdir`: a second start is refused,
naming the first; a dead run's lock is taken over). SIGTERM and SIGINT stop the run
after the step they arrive in, with a checkpoint at that step
(`deq_jax.training.run.preemption`); the `RunResult` then says which signal
(``stopped_by``), and the same call resumes there.

Files in the workdir: ``run.lock`` (while a run is live), ``checkpoints/`` (orbax),
``checkpoints_best/`` (the best state and its record), ``metrics.jsonl``,
``tensorboard/`` (with tensorboardX installed), ``config.json``, the family's report
and ``data/`` (converted image records, a corpus's token ids, unless ``task.data_dir``
is set).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from deq_jax.training.families import family_for
from deq_jax.training.families.family import Family
from deq_jax.training.families.setup import begin_run
from deq_jax.training.loop.loop import (  # interval_mean, SPARSE_METRICS: re-exported for callers
    SPARSE_METRICS,  # noqa: F401
    Loop,
    RunResult,
    interval_mean,  # noqa: F401
)
from deq_jax.training.run.nonfinite import NonFiniteLossError  # noqa: F401 (re-exported)
from deq_jax.training.run.preemption import StopRequests
from deq_jax.training.run.writers import read_metrics, write_text
from deq_jax.training.solver_fit.alternating import AlternatingSolver
from deq_jax.training.solver_fit.spec import NeuralSolverSpec

# The config a run was trained under, written into its workdir at every start.
CONFIG_FILE = "config.json"


def config_json(config: Any) -> str:
    """``config`` as the JSON text of a run's `CONFIG_FILE` (tuples become lists)."""
    if hasattr(config, "to_json_best_effort"):
        return config.to_json_best_effort(indent=2)
    return json.dumps(dict(config), indent=2, default=str)


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
    line says so. Asked before anything is written.
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


def _finished_result(loop_splits, workdir: str, run, report: dict) -> RunResult:
    """The `RunResult` of a finished run: its saved ``report`` and the evaluation of
    ``loop_splits`` at its step that its ``metrics.jsonl`` holds."""
    eval_metrics = {}
    for record in read_metrics(workdir):
        if record["step"] == run.start_step and record["split"] in loop_splits:
            eval_metrics[record["split"]] = {
                k: v for k, v in record.items() if k not in ("step", "split")
            }
    return RunResult(run.state, run.start_step, eval_metrics, report, run.carry)


def train_and_evaluate(
    config: Any,
    workdir: str,
    *,
    emit: Callable[[str], None] = print,
    family: Family | None = None,
) -> RunResult:
    """Trains and evaluates the model the config describes, in ``workdir``.

    Args:
      config: an `ml_collections.ConfigDict` with the sections of
        ``configs/default.py`` (task, model, deq, train, eval, ckpt, log).
      workdir: where checkpoints, metrics, TensorBoard events and the report go; a
        workdir with checkpoints is resumed from the latest one.
      emit: receives every human-readable line (progress, evaluation, report).
      family: the task family (``None``: `family_for` the config).

    Returns:
      A `RunResult`.

    Raises:
      ValueError: for an invalid config (unknown names list the valid ones; a batch
        size that does not split over the devices names the device count).
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
      VocabularyMismatchError: if a language model's workdir was trained on another
        vocabulary.
      NonFiniteLossError: after ``train.max_nonfinite_steps`` steps in a row with a
        non-finite loss or gradient norm (each one skipped, logged and counted as
        ``skipped_steps``); the message names the steps and the last good checkpoint,
        which is kept.
      WorkdirError: if the workdir cannot be created or written.
      WorkdirLockedError: if another live run holds the workdir.
      CheckpointSaveError: if writing a checkpoint failed (the earlier ones are intact).
    """
    family = family or family_for(config, emit)
    lock = begin_run(config, workdir, emit)
    try:
        with StopRequests() as stop:
            return _train(config, workdir, emit, family, stop)
    finally:
        if lock is not None:
            lock.release()


def _train(config: Any, workdir: str, emit, family: Family, stop: StopRequests) -> RunResult:
    """`train_and_evaluate` once the workdir is held and the stop signals are caught."""
    tc = config.train
    solver_spec = NeuralSolverSpec.from_run_config(config)
    if solver_spec.alternating and not family.alternates:
        raise ValueError(
            f"neural_solver.alternating trains task models; {type(family).__name__} fits "
            "its neural solver after training (neural_solver.deq_workdir). Set "
            "neural_solver.alternating=False."
        )
    run = family.setup(config, workdir)
    start = run.start_step
    previous = earlier_report(workdir, family.report_file, start)
    ckpt = run.checkpointer
    if run_is_finished(previous, workdir, family.report_file, start, tc.steps, ckpt, emit):
        splits = {*(tuple(config.eval.splits) or run.task.eval_splits), *run.task.eval_splits}
        return _finished_result(splits, workdir, run, family.saved_report(previous))
    if jax.process_index() == 0:
        write_text(os.path.join(workdir, CONFIG_FILE), config_json(config))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(run.state.params))
    emit(
        f"{family.describe(run)}: {n_params} parameters, {run.mesh.devices.size} device(s), "
        f"{'resuming from step ' + str(start) if start else 'starting from scratch'}; "
        f"workdir {workdir}"
    )
    alternating = None
    if solver_spec.alternating:
        alternating = AlternatingSolver(solver_spec, run.model, run.task, emit)
    loop = Loop(config, workdir, family, run, emit, previous, stop, alternating)
    began = time.perf_counter()
    try:
        last = min(tc.stop_at_step, tc.steps) if tc.stop_at_step else tc.steps
        last_step = loop.train(last)
        return loop.finish(last_step, time.perf_counter() - began)
    finally:
        loop.close()


def evaluate_checkpoint(config: Any, workdir: str, *args: Any, **options: Any) -> dict:
    """Scores a checkpoint of ``workdir`` (the best on validation if the run has one,
    else the latest) on any splits and solver budgets, whatever the family: the
    family's own (`Family.evaluate_checkpoint`) with the same arguments.

    Args:
      config: the configuration the run was trained with.
      workdir: the run's directory.
      *args: ``splits`` (empty: every eval split of the task) and ``max_iters`` (empty:
        the family's budgets: the tasks' report budgets, the language model's eval
        budget), as positions or keywords.
      **options: ``emit`` (a line per split and budget, then the table),
        ``checkpoint`` (``"best"``, ``"last"`` or ``""``: the best if there is one),
        ``max_batches`` (the first batches of each split; 0: all), ``exclude`` (a
        language model's characters scored apart,
        `deq_jax.training.families.lm_evaluate.evaluate_lm_checkpoint`) and a task's ``run``
        (`deq_jax.training.families.evaluate.evaluate_task_checkpoint`).

    Returns:
      ``{"max_iter=K": {split: metrics}}``.

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint.
      ValueError: for an unknown ``checkpoint`` or an option the family lacks.
      CheckpointMismatchError: if the checkpoint does not fit the config's model.
    """
    family = family_for(config, options.get("emit", print))
    return family.evaluate_checkpoint(config, workdir, *args, **options)
