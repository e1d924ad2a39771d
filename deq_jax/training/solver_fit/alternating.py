"""Alternating DEQ and neural-solver training (Appendix D of Bai et al. 2022).

With ``neural_solver.alternating=True`` the DEQ trains ``alt_warmup_steps`` steps with
its configured solver; then a neural solver is fitted to a snapshot of the DEQ
(``neural_solver.train_steps`` steps), the DEQ trains ``alt_deq_steps`` (``M``) steps
with that solver in its forward pass, the solver is fine-tuned ``alt_finetune_steps``
(``T``) steps on the current DEQ, and so on. The neural solver replaces the forward
solver only: an ``ift`` backward that reused the forward solver gets its own Anderson
solver with the same tolerance and budget. The solver keeps the configured solver's
``tol`` and ``stop_mode`` and the model's budgets, so the savings show up as fewer
solver steps (``nstep_mean`` in the metrics).

A resumed run past the warm-up refits the solver at its first step (the solver is not
part of the DEQ's checkpoint).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Appendix D).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from deq_jax.backward.ift import ift
from deq_jax.solvers.anderson import anderson
from deq_jax.training.solver_fit.frozen_deq import FrozenDEQ
from deq_jax.training.solver_fit.spec import NeuralSolverSpec, SolverFit, fit


class AlternatingSolver:
    """Decides when to (re)fit the neural solver and builds the model that uses it.

    Args:
      spec: the ``neural_solver`` section (``alternating`` must be true).
      model: the DEQ task model as the config builds it.
      task: the task (training batches for the fixed points, ``batch_extras``).
      emit: receives the progress lines.
    """

    def __init__(
        self, spec: NeuralSolverSpec, model: nn.Module, task: Any, emit: Callable[[str], None]
    ):
        self.spec, self.model, self.task, self.emit = spec, model, task, emit
        self.fitted: SolverFit | None = None
        # The transforms of evaluation: no augmentation of the solver's batches.
        self._batches = task.train_iterator(spec.batch_size, seed=spec.seed + 1, augment=False)

    def model_for(self, step: int, start: int, state: Any) -> nn.Module | None:
        """The training loop's hook: the model with a (re)fitted solver when one is
        `due` before step ``step``, else ``None`` (the model stays)."""
        return self.refresh(state) if self.due(step, start) else None

    def due(self, step: int, start: int) -> bool:
        """Whether the solver is (re)fitted before training step ``step`` (1-based)."""
        done = step - 1  # DEQ steps finished before this one
        if done < self.spec.alt_warmup_steps:
            return False
        if step == start + 1:  # first step of this invocation: no solver in memory yet
            return True
        return (done - self.spec.alt_warmup_steps) % self.spec.alt_deq_steps == 0

    def refresh(self, state: Any) -> nn.Module:
        """Fits (first call) or fine-tunes the solver on the DEQ in ``state``.

        Returns:
          The model with the neural solver and its learned initialiser.
        """
        spec, first = self.spec, self.fitted is None
        # The weights being trained (the solver runs in their training solves too).
        variables = jax.device_get(state.variables(state.params))
        frozen = FrozenDEQ(
            self.model,
            variables,
            target_solver=spec.target_solver(),
            extras=self.task.batch_extras,
        )
        targets = spec.targets(frozen, self._batches, self.emit)
        steps = spec.train_steps if first else spec.alt_finetune_steps
        self.fitted = fit(spec, frozen, targets, num_steps=steps, start=self.fitted)
        self.emit(
            f"neural solver {'fitted' if first else 'fine-tuned'} at DEQ step "
            f"{int(state.step)}: {steps} steps in {self.fitted.seconds:.1f} s, loss "
            f"{self.fitted.losses[-1]:.4g}"
        )
        spec = self.model.deq
        base = spec.solver
        solver = self.fitted.solver.replace(tol=base.tol, stop_mode=base.stop_mode)
        backward = spec.backward
        if isinstance(backward, ift) and backward.solver is None:
            budget = spec.budget(train=True)
            backward = dataclasses.replace(backward, solver=anderson(tol=base.tol, max_iter=budget))
        return self.model.clone(
            deq=spec.replace(solver=solver, z_init=self.fitted.init or "zeros", backward=backward)
        )
