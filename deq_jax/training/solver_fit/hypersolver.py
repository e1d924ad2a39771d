"""`train_hypersolver(config, workdir)`: a neural solver for a trained model, from a config.

The config is the model's own (task, model, deq, ... sections) plus a ``neural_solver``
section whose ``deq_workdir`` names the trained model's workdir. One run serves every
family (`deq_jax.training.solver_fit.runs.fit_solvers`); `solver_family` picks what differs:

* `TASKS`, the task models (`deq_jax.training.families.task_family`): training batches as the task
  gives them, not augmented; the comparison scores the eval splits (``eval.batch_size``,
  ``eval.max_batches``) and prints the accuracies (or the error) per split;
* `deq_jax.training.solver_fit.language.LANGUAGE`, the language model: training segments
  with their memory; the comparison streams validation segments.

`load_hypersolver` restores the fitted solvers for the solver sweeps
(``experiments/neural_solver``).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from flax import linen as nn

from deq_jax.training.families import family_for
from deq_jax.training.families.evaluate import Evaluator
from deq_jax.training.families.task_family import TaskFamily
from deq_jax.training.solver_fit.language import LANGUAGE
from deq_jax.training.solver_fit.runs import (
    REPORT_FILE,
    HyperSolverRun,
    SolverFamily,
    fit_solvers,
    load_solvers,
    read_solver_report,
)
from deq_jax.training.solver_fit.spec import NeuralSolverSpec

__all__ = [
    "REPORT_FILE",
    "TASKS",
    "HyperSolverRun",
    "load_hypersolver",
    "read_solver_report",
    "solver_family",
    "train_hypersolver",
]


def _task_batches(
    config: Any, run: Any, variables: Any, spec: NeuralSolverSpec
) -> Iterator[dict[str, Any]]:
    """The task's training batches of ``spec.batch_size``, in an order of their own and
    with the transforms of evaluation (no crops or flips: the paper's fit)."""
    del config, variables  # a task's batches do not depend on the model
    return run.task.train_iterator(spec.batch_size, seed=spec.seed + 1, augment=False)


def _task_held_out(
    config: Any, run: Any, variables: Any, spec: NeuralSolverSpec, split: str
) -> Iterator[dict[str, Any]]:
    """Full batches of ``spec.batch_size`` of the eval ``split`` (the validation split,
    else the first eval split, when empty)."""
    del config, variables
    task = run.task
    split = split or task.validation_split or task.eval_splits[0]
    for batch in task.eval_iterator(split, spec.batch_size):
        if "mask" not in batch or bool(np.all(batch["mask"])):
            yield batch


def _task_score(config: Any, run: Any, model: nn.Module, max_iter: int) -> dict[str, Any]:
    """``model``'s metrics per eval split at ``max_iter``."""
    evaluator = Evaluator(
        model, run.task, run.mesh, config.eval.batch_size, config.eval.max_batches
    )
    return evaluator.evaluate_splits(run.state, run.task.eval_splits, max_iter)


def _task_lines(comparison: dict[str, Any], run: Any) -> list[str]:
    """A line per solver and split: the accuracies (or the error) and the mean steps."""
    del run
    lines = []
    for name, by_split in comparison.items():
        for split, metrics in by_split.items():
            shown = {k: v for k, v in metrics.items() if k.endswith("accuracy") or k == "mse"}
            shown["nstep_mean"] = metrics["nstep_mean"]
            lines.append(
                f"eval {name} {split}: " + "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
            )
    return lines


TASKS = SolverFamily(
    what="DEQ",
    short="DEQ",
    train_hint="python -m launch.main --config configs/<task>.py --workdir DIR, "
    "without the neural_solver section",
    training=TaskFamily,
    extras=lambda run: run.task.batch_extras,
    batches=_task_batches,
    held_out=_task_held_out,
    score=_task_score,
    eval_lines=_task_lines,
)


def solver_family(config: Any) -> SolverFamily:
    """The family of ``config``'s model: the one whose `SolverFamily.training` is the
    family the training loop picks for it (`deq_jax.training.families.family_for`).

    Raises:
      ValueError: for a training family without a neural-solver fit.
    """
    training = type(family_for(config))
    for family in (TASKS, LANGUAGE):
        if family.training is training:
            return family
    raise ValueError(f"No neural-solver fit for models trained by {training.__name__}.")


def train_hypersolver(
    config: Any,
    workdir: str,
    *,
    family: SolverFamily | None = None,
    emit: Callable[[str], None] = print,
) -> HyperSolverRun:
    """Fits a neural solver (and its ablations) to the model of ``neural_solver.deq_workdir``:
    `fit_solvers` with ``family``, `solver_family` of ``config`` by default.

    ``config`` is the model's config with a ``neural_solver`` section (see
    ``configs/default.py``, ``configs/prefix_sum_hypersolver.py`` and
    ``configs/lm_shakespeare_hypersolver.py``); the checkpoints and ``neural_solver.json``
    go to ``workdir``; ``emit`` receives every human-readable line.

    Raises:
      ValueError: if the model's workdir has no checkpoint, or its fixed points cannot
        be found to ``max_target_residual``.
    """
    return fit_solvers(family or solver_family(config), config, workdir, emit)


def load_hypersolver(
    config: Any,
    workdir: str,
    emit: Callable[[str], None] = print,
    *,
    family: SolverFamily | None = None,
) -> HyperSolverRun:
    """Restores the solvers `train_hypersolver` wrote to ``workdir`` (and their model).

    Raises:
      FileNotFoundError: if ``workdir`` holds no ``neural_solver.json``.
    """
    return load_solvers(family or solver_family(config), config, workdir, emit)
