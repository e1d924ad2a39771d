"""`train_and_evaluate(config, workdir)`: the one training loop, from start-up to the report.

Every task family runs this loop, the language model included; a `Family`
(`deq_jax.training.family`) brings what differs: its set-up, its train step and the
carry threaded between steps (the language model's segment memory), its evaluator and
its final report. `family_for` picks the family from the config: the language model
(``model.name="deq_transformer_lm"``, `deq_jax.training.lm_family`) or every other task
(`deq_jax.training.task_family`).

One call builds everything from the config, restores the latest checkpoint of the
workdir if there is one, trains to ``config.train.steps`` with the data iterator
resumed at the restored step, logs and evaluates periodically, saves checkpoints, keeps
the state with the best validation score besides the last (`deq_jax.training.selection`:
scored after each periodic evaluation past the warm-up, and at the end) and ends with
the family's final report of that best state. The first ``train.pretrain_steps`` steps
train the same parameters as the explicit weight-tied network (the model's
``mode="weight_tied"``), which the periodic evaluation then scores and which is never
selected. A step with a non-finite loss or gradient norm is skipped and logged; after
``train.max_nonfinite_steps`` in a row the run stops. A finished workdir run again with
the same ``train.steps`` says so and writes nothing; with a larger one it continues.

Files in the workdir: ``checkpoints/`` (orbax), ``checkpoints_best/`` (the best state
and its record), ``metrics.jsonl``, ``tensorboard/``, ``config.json``, the family's
report and ``data/`` (generated data, unless ``task.data_dir`` is set).

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

from deq_jax.training.evaluate import short_metrics, weights_to_score
from deq_jax.training.family import Family
from deq_jax.training.lm_family import LanguageModelFamily
from deq_jax.training.nonfinite import (  # NonFiniteLossError: re-exported for callers
    SKIPPED,
    NonFiniteLossError,  # noqa: F401
    NonFiniteSteps,
    logged,
)
from deq_jax.training.selection import BestCheckpoint, SelectionRule
from deq_jax.training.state import TrainState
from deq_jax.training.task_family import TaskFamily
from deq_jax.training.writers import MetricWriter, ProgressLogger, read_metrics, write_text

# Models trained by `LanguageModelFamily`; every other model by `TaskFamily`.
LANGUAGE_MODELS = ("deq_transformer_lm",)


class RunResult(NamedTuple):
    """What `train_and_evaluate` returns.

    Attributes:
      state: the final train state (replicated over the mesh).
      step: the step training stopped at.
      eval_metrics: ``{split: metrics}`` of the last evaluation at the eval budget (at
        the end of training: of the best checkpoint, which the report scores).
      report: the family's final report of the best checkpoint (the tasks'
        ``{budget: {split: metrics}}``, the language model's ``{split: metrics}``;
        ``{}`` when the run stopped early through ``train.stop_at_step``).
      carry: what the last step handed to the next (the language model's segment
        memory; ``None`` for the tasks).
    """

    state: TrainState
    step: int
    eval_metrics: dict[str, dict]
    report: dict
    carry: Any = None


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


def family_for(config: Any, emit: Callable[[str], None] = print) -> Family:
    """The `Family` that trains ``config.model``: `LanguageModelFamily` for the
    `LANGUAGE_MODELS`, `TaskFamily` for every other."""
    if config.model.get("name") in LANGUAGE_MODELS:
        return LanguageModelFamily()
    return TaskFamily(emit)


class Loop:
    """One invocation of the training loop: the run, its writers, its selection and the
    phases of its model; `train` runs the steps, `finish` saves and reports.

    Args:
      config: the run's configuration.
      workdir: the run's directory.
      family: its `Family`.
      run: its `deq_jax.training.setup.Run` (``family.setup``'s).
      emit: receives every human-readable line.
      previous: the report of the run this one continues (`earlier_report`), or ``None``.
    """

    def __init__(self, config, workdir, family: Family, run, emit, previous: dict | None):
        self.config, self.workdir, self.family, self.run = config, workdir, family, run
        self.emit, self.previous = emit, previous
        self.lead = jax.process_index() == 0
        self.state, self.carry = run.state, run.carry
        self.writer = MetricWriter(workdir, tensorboard=config.log.tensorboard, enabled=self.lead)
        self.best = BestCheckpoint(workdir, SelectionRule.from_config(config.eval, run.task), emit)
        self.progress = ProgressLogger(config.train.steps, run.start_step, emit=emit)
        limit = config.train.max_nonfinite_steps
        self.nonfinite = NonFiniteSteps(limit, run.checkpointer, emit, family.advice)
        self.periodic_splits = tuple(config.eval.splits) or tuple(run.task.eval_splits)
        self.eval_metrics: dict[str, dict] = {}
        self.report_extra: dict[str, Any] = {}
        self.phases: dict[bool, Any] = {}
        self.build(run.model)

    def build(self, model: Any) -> None:
        """The phases of ``model``: the main one and, with ``train.pretrain_steps``, the
        weight-tied warm-up."""
        self.model = model
        self.phases = {False: self.family.phase(self.config, self.run, model, warmup=False)}
        if self.config.train.pretrain_steps:
            self.phases[True] = self.family.phase(self.config, self.run, model, warmup=True)

    def warming(self, step: int) -> bool:
        """Whether ``step`` is a step of the weight-tied warm-up."""
        return step <= self.config.train.pretrain_steps

    def evaluate(
        self,
        step: int,
        *,
        scored: TrainState | None = None,
        splits=(),
        max_batches: int | None = None,
    ) -> dict[str, dict]:
        """``splits`` (or ``eval.splits``) of ``scored`` (or the state) at ``step``,
        each split's first ``max_batches`` batches (``None``: ``eval.max_batches``; 0:
        all), written and printed; ``{split: metrics}`` of the average's weights."""
        evaluator = self.phases[self.warming(step)].evaluator
        evaluator.max_batches = self.config.eval.max_batches if max_batches is None else max_batches
        results = {}
        weights = weights_to_score(self.state if scored is None else scored, self.config.eval)
        for split in splits or self.periodic_splits:
            for suffix, scored_weights in weights.items():
                metrics = evaluator.evaluate(scored_weights, split)
                results.setdefault(split, metrics)  # the average's (or the only weights')
                self.writer.write(step, split + suffix, metrics)
                self.emit(f"eval step {step} {split + suffix}: {short_metrics(metrics)}")
        self.progress.restart_clock(step)
        return results

    def select(self, step: int, results: dict[str, dict]) -> None:
        """Offers the state (past the warm-up) to the best checkpoint, scored on the
        selection split as the periodic evaluation scores it (its split evaluated if
        ``results`` lack it)."""
        if self.warming(step):
            return
        evaluator, rule = self.phases[False].evaluator, self.best.rule
        evaluator.max_batches = self.config.eval.max_batches
        metrics = results.get(rule.split) or evaluator.evaluate(self.state, rule.split)
        self.best.offer(step, self.state, rule.score(metrics))

    def train(self, stop: int) -> int:
        """Runs the steps after the restored one up to ``stop``; returns the last step."""
        config, family, start = self.config, self.family, self.run.start_step
        tc, ckpt = config.train, self.run.checkpointer
        batches = family.train_batches(config, self.run)
        history: list[dict[str, Any]] = []
        for step in range(start + 1, stop + 1):
            model = family.refresh(step, start, self.state)
            if model is not None:
                self.build(model)
                self.progress.restart_clock(step)
            warming = self.warming(step)
            run_step = self.phases[warming].step
            self.state, self.carry, metrics = run_step(self.state, self.carry, next(batches), step)
            if warming and step == tc.pretrain_steps:
                self.emit(
                    f"step {step}: weight-tied warm-up done; training the {self.model.mode} "
                    "model now"
                )
            skipped = self.nonfinite.skipped(metrics, step)
            history.append(logged(metrics, skipped))
            if step == start + 1:
                self.progress.restart_clock(step)
            if step % config.log.every_steps == 0 or step == stop:
                mean = interval_mean(history, family.sparse_metrics)
                self.writer.write(step, "train", mean)
                self.progress.line(step, mean)
                history = []
            if config.eval.every_steps and step % config.eval.every_steps == 0 and step < tc.steps:
                self.eval_metrics = self.evaluate(step)
                self.select(step, self.eval_metrics)
            if not skipped:  # the latest checkpoint stays the last good one
                ckpt.maybe_save(step, family.checkpoint_item(self.state, self.carry))
        return max(stop, start)

    def finish(self, last_step: int, train_seconds: float) -> RunResult:
        """Saves the last step and, at ``train.steps``, selects and reports."""
        ckpt = self.run.checkpointer
        ckpt.maybe_save(last_step, self.family.checkpoint_item(self.state, self.carry), force=True)
        ckpt.wait()
        if self.previous is not None:
            train_seconds += self.previous.get("train_seconds") or 0.0
        report: dict = {}
        if last_step >= self.config.train.steps:
            self.select(last_step, {})
            best = self.best
            scored = self.state if best.step in (None, last_step) else best.restore(self.state)
            self.report_extra = dict(step=last_step, best=best.record, train_seconds=train_seconds)
            self.eval_metrics, report = self.family.final_report(self, scored, last_step)
        return RunResult(self.state, last_step, self.eval_metrics, report, self.carry)

    def close(self) -> None:
        self.run.checkpointer.close()
        self.best.close()
        self.writer.close()


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
    """
    family = family or family_for(config, emit)
    tc = config.train
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
    loop = Loop(config, workdir, family, run, emit, previous)
    began = time.perf_counter()
    try:
        stop = min(tc.stop_at_step, tc.steps) if tc.stop_at_step else tc.steps
        last_step = loop.train(stop)
        return loop.finish(last_step, time.perf_counter() - began)
    finally:
        loop.close()
