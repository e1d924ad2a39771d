"""`TaskFamily`: the training loop's part for every `deq_jax.tasks` task but text.

A batch is one independent set of examples (no carry between steps). The train step is
`deq_jax.training.families.steps.make_train_step` with the Jacobian regulariser and the
path-independence interventions of the config (neither in the weight-tied warm-up);
``regularizer.spectral_every`` logs the spectral radius of the fixed point before the
step; ``neural_solver.alternating`` interleaves neural-solver fits with the DEQ's
training (`deq_jax.training.solver_fit.alternating`, which the loop runs: ``alternates``). The
final report is the per-budget report of `deq_jax.training.families.evaluate.final_report`
(per length for the length-generalisation tasks), written to
``length_generalization.json`` with ``train_seconds`` (the wall time of the training
loop, summed over the invocations that continued a finished run).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from deq_jax.training.families import evaluate
from deq_jax.training.families.family import Family, Phase, Step, warmup_model
from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.metrics import is_regression
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.settle import SettleRule
from deq_jax.training.families.setup import Run, setup
from deq_jax.training.families.steps import make_spectral_step, make_train_step
from deq_jax.training.run import sharding
from deq_jax.training.run.state import TrainState


def task_step(train_step, spectral_step, spectral_every: int, mesh, extras) -> Step:
    """The loop's `Step` of a task: the batch sharded over ``mesh``, the spectral radius
    estimated first every ``spectral_every`` steps (0: never), no carry."""

    def step(state: TrainState, carry: Any, batch: dict[str, Any], number: int):
        batch = evaluate.device_batch(batch, mesh, extras)
        spectral = {}
        if spectral_every and (number - 1) % spectral_every == 0:
            spectral = jax.device_get(spectral_step(state, batch))
        state, metrics = train_step(state, batch)
        return state, carry, {**jax.device_get(metrics), **spectral}

    return step


class TaskFamily(Family):
    """The training loop's part for the `deq_jax.tasks` tasks (module docstring).

    Args:
      emit: receives the neural-solver fit's progress lines.
    """

    report_file = evaluate.REPORT_FILE
    alternates = True
    advice = (
        "Lower train.learning_rate, tighten train.grad_clip_norm or make the cell more contractive."
    )
    sparse_metrics = ("jacobian_term", "spectral_radius")

    def __init__(self, emit: Callable[[str], None] = print):
        self.emit = emit
        self.regularizer = JacobianRegularizer()
        self.interventions = PathIndependence()

    def setup(self, config: Any, workdir: str) -> Run:
        self.regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
        self.interventions = PathIndependence.from_config(config.get("path_independence", {}))
        return setup(config, workdir)

    def describe(self, run: Run) -> str:
        return run.model.__class__.__name__

    def train_batches(self, config: Any, run: Run) -> Iterator[dict[str, Any]]:
        return run.task.train_iterator(
            config.train.batch_size,
            seed=config.train.seed,
            start_step=run.start_step,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def phase(self, config: Any, run: Run, model: Any, warmup: bool) -> Phase:
        """The warm-up trains the weight-tied network without the Jacobian term or the
        interventions (there is no fixed point yet); the spectral radius is the DEQ's."""
        task, mesh, extras = run.task, run.mesh, run.task.batch_extras
        net = warmup_model(model, config.train.pretrain_steps) if warmup else model
        train_step = make_train_step(
            net,
            task.metrics,
            run.schedule,
            mesh,
            regression=is_regression(task),
            regularizer=None if warmup else self.regularizer,
            interventions=None if warmup else self.interventions,
            extras=extras,
            loss_fn=getattr(task, "loss", None),
            state_sharding=sharding.shardings_of(run.state),
        )
        spectral_step = make_spectral_step(
            model, mesh, self.regularizer.spectral_iters, extras=extras
        )
        evaluator = evaluate.Evaluator(
            net,
            task,
            mesh,
            config.eval.batch_size,
            max_batches=config.eval.max_batches,
            settle=SettleRule.from_config(config.deq),
        )
        every = self.regularizer.spectral_every
        lower = lambda state, carry, batch: train_step.lower(
            state, evaluate.device_batch(batch, mesh, extras)
        )
        return Phase(task_step(train_step, spectral_step, every, mesh, extras), evaluator, lower)

    def final_report(self, loop: Any, scored: TrainState, step: int):
        """The per-budget report of every eval split, after the eval budget's
        evaluation of ``eval.splits`` (read off the report where a budget is it)."""
        config, emit = loop.config, loop.emit
        same = evaluate.eval_budget_name(config)
        eval_budget = config.deq.eval_max_iter or config.deq.train_max_iter
        budgets = evaluate.report_budgets(config)
        emit(
            f"Final evaluation at step {step} of {loop.best.describe()}: "
            + ("" if same else f"the eval budget ({eval_budget} iterations), then ")
            + f"budgets {budgets}, a line per split:"
        )
        eval_metrics = {} if same else loop.evaluate(step, scored=scored, max_batches=0)
        evaluator = loop.phases[False].evaluator
        report = evaluate.final_report(
            config, evaluator, scored, loop.run.task.eval_splits, loop.writer, emit, step
        )
        if loop.lead:
            extra = {**loop.report_extra, "budgets": budgets}
            emit(f"Wrote {evaluate.write_report(loop.workdir, report, extra)}")
        if same:
            splits = loop.periodic_splits
            eval_metrics = {s: report[same][s] for s in splits if s in report[same]}
            for split, metrics in eval_metrics.items():
                loop.writer.write(step, split, metrics)
            if missing := tuple(s for s in splits if s not in report[same]):  # valid
                full = loop.evaluate(step, scored=scored, splits=missing, max_batches=0)
                eval_metrics.update(full)
        return eval_metrics, report

    def evaluate_checkpoint(self, config: Any, workdir: str, *args: Any, **options: Any) -> dict:
        return evaluate.evaluate_task_checkpoint(config, workdir, *args, **options)

    def saved_report(self, previous: Mapping[str, Any]) -> dict:
        return previous["report"]
