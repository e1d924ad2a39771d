"""`Loop`: one invocation of the training loop (`deq_jax.training.loop.train`), and the
`RunResult` it returns.

The loop's own work is the same for every family: the phases of the model (the
weight-tied warm-up and the main phase, each a `deq_jax.training.families.family.Phase`), the
steps with the carry threaded through them, the logging interval's means
(`interval_mean`), non-finite steps skipped and counted, the periodic evaluation and the
selection of the best state past the warm-up, checkpoints (the latest stays the last
good one), and at the end the family's final report of the selected state.

A stop on request (SIGTERM or SIGINT, `deq_jax.training.run.preemption`) ends the loop after
the step it arrives in, at a step every process agrees on: that step's evaluation is
skipped, a checkpoint is saved at it, one line says so, and the run returns without a
final report. Resumed there, the loop first runs the periodic evaluation the stop
skipped, so the selection of the best state is that of an uninterrupted run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from typing import Any, NamedTuple

import jax
import numpy as np

from deq_jax.training.families.evaluate import short_metrics, weights_to_score
from deq_jax.training.families.family import Family
from deq_jax.training.loop.floor_notice import FloorNotice
from deq_jax.training.run.nonfinite import SKIPPED, NonFiniteSteps, logged
from deq_jax.training.run.preemption import StopRequests
from deq_jax.training.run.selection import BestCheckpoint, SelectionRule
from deq_jax.training.run.state import TrainState
from deq_jax.training.run.writers import METRICS_FILE, MetricWriter, ProgressLogger, read_metrics


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
      stopped_by: the signal that stopped the run before ``train.steps`` (``"SIGTERM"``,
        ``"SIGINT"``; a checkpoint at ``step`` was saved), or ``None``.
    """

    state: TrainState
    step: int
    eval_metrics: dict[str, dict]
    report: dict
    carry: Any = None
    stopped_by: str | None = None


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


class Loop:
    """One invocation of the training loop: the run, its writers, its selection and the
    phases of its model; `train` runs the steps, `finish` saves and reports.

    Args:
      config: the run's configuration.
      workdir: the run's directory.
      family: its `Family`.
      run: its `deq_jax.training.families.setup.Run` (``family.setup``'s).
      emit: receives every human-readable line.
      previous: the report of the run this one continues (`earlier_report`), or ``None``.
      stop: the run's `StopRequests` (``None``: stops only at the end).
      alternating: gives a new model to train from a step on, or ``None``
        (``model_for(step, start, state)``; `deq_jax.training.solver_fit.alternating`'s neural
        solver refitted), or is ``None``.
    """

    def __init__(
        self,
        config,
        workdir,
        family: Family,
        run,
        emit,
        previous: dict | None,
        stop: StopRequests | None = None,
        alternating: Any = None,
    ):
        self.config, self.workdir, self.family, self.run = config, workdir, family, run
        self.emit, self.previous = emit, previous
        self.stop = stop if stop is not None else StopRequests()
        self.alternating = alternating
        self.stopped_by: str | None = None
        self.lead = jax.process_index() == 0
        self.state, self.carry = run.state, run.carry
        self.writer = MetricWriter(
            workdir, tensorboard=config.log.tensorboard, enabled=self.lead, emit=emit
        )
        self.best = BestCheckpoint(workdir, SelectionRule.from_config(config.eval, run.task), emit)
        self.progress = ProgressLogger(config.train.steps, run.start_step, emit=emit)
        limit = config.train.max_nonfinite_steps
        self.nonfinite = NonFiniteSteps(limit, run.checkpointer, emit, family.advice)
        precision = config.deq.get("precision", "default")  # configs saved before issue 78 lack it
        self.floor_notice = FloorNotice(config.deq.solver.tol, precision, emit)
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

    def evaluation_due(self, step: int) -> bool:
        """Whether ``step`` has a periodic evaluation."""
        every = self.config.eval.every_steps
        return bool(every) and step % every == 0 and step < self.config.train.steps

    def skipped_evaluation(self, start: int) -> bool:
        """Whether the restored step ``start`` is due a periodic evaluation that the
        workdir's metrics lack (a stop on request skipped it)."""
        if not start or not self.evaluation_due(start):
            return False
        written = os.path.exists(os.path.join(self.workdir, METRICS_FILE))
        records = read_metrics(self.workdir) if written else []
        done = {r["split"] for r in records if r["step"] == start}
        return any(split not in done for split in self.periodic_splits)

    def stop_after(self, step: int, saved: bool = False) -> int:
        """Saves a checkpoint at ``step`` (unless ``saved``) once a stop was requested,
        says so, and returns ``step``."""
        ckpt = self.run.checkpointer
        self.stopped_by = self.stop.signal_name
        if not saved:
            ckpt.maybe_save(step, self.family.checkpoint_item(self.state, self.carry), force=True)
        ckpt.wait()
        processes = jax.process_count()
        agreed = f" (all {processes} processes)" if processes > 1 else ""
        self.emit(
            f"Stopped by {self.stopped_by} after step {step}: saved a checkpoint at step "
            f"{step}{agreed} in {ckpt.directory}. Run the same command again to resume from it."
        )
        return step

    def train(self, stop: int) -> int:
        """Runs the steps after the restored one up to ``stop``; returns the last step
        (earlier after a stop on request, `stopped_by`)."""
        config, family, start = self.config, self.family, self.run.start_step
        tc, ckpt = config.train, self.run.checkpointer
        if self.stop.local():  # asked to stop during the set-up: nothing new to save
            self.stopped_by = self.stop.signal_name
            self.emit(f"Stopped by {self.stopped_by} before step {start + 1}; nothing to save.")
            return start
        if self.skipped_evaluation(start):
            self.eval_metrics = self.evaluate(start)
            self.select(start, self.eval_metrics)
        batches = family.train_batches(config, self.run)
        history: list[dict[str, Any]] = []
        for step in range(start + 1, stop + 1):
            model = self.alternating and self.alternating.model_for(step, start, self.state)
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
                self.floor_notice.check(step, mean)
                history = []
            if self.stop.reached(step):  # every process asks at every step
                return self.stop_after(step)
            if self.evaluation_due(step):
                self.eval_metrics = self.evaluate(step)
                self.select(step, self.eval_metrics)
            saved = False
            if not skipped:  # the latest checkpoint stays the last good one
                saved = ckpt.maybe_save(step, family.checkpoint_item(self.state, self.carry))
            if self.stop.local():  # a signal during the evaluation or the save
                return self.stop_after(step, saved)
        return max(stop, start)

    def finish(self, last_step: int, train_seconds: float) -> RunResult:
        """Saves the last step and, at ``train.steps``, selects and reports (after a
        stop on request: neither)."""
        ckpt = self.run.checkpointer
        if self.stopped_by is not None:
            carry, metrics = self.carry, self.eval_metrics
            return RunResult(self.state, last_step, metrics, {}, carry, self.stopped_by)
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
