"""Fitting a neural solver to a frozen task model, from the ``neural_solver`` config section.

Shared by the solver's own run (`deq_jax.training.hypersolver`) and by the alternating
mode of DEQ training (`deq_jax.training.alternating`):

* `NeuralSolverSpec`: the config section as a dataclass (`NeuralSolverSpec.from_config`);
* `collect_targets`: a pool of ``(args, x, z*)`` batches from a `FrozenDEQ`, with the
  target solve's residual checked;
* `fit`: builds (or continues) a solver and an initialiser for the model's state and
  trains them on the pool (`train_neural_solver`), timed.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2, App. D).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax

from deq_jax._sections import from_section
from deq_jax.neural_solver.initializer import LearnedInit, make_initializer
from deq_jax.neural_solver.solver import init_neural_solver, neural_solver
from deq_jax.neural_solver.state_shape import StateShape, state_shape_of
from deq_jax.solvers.anderson import anderson
from deq_jax.training.frozen_deq import (
    FrozenDEQ,
    Targets,
    initializer_features,
    initializer_kind,
    learned_init,
)
from deq_jax.training.solver_train import train_neural_solver


@dataclasses.dataclass(frozen=True)
class NeuralSolverSpec:
    """The ``neural_solver`` config section and the budgets of ``deq.neural_solver``.

    Its field defaults are the one home of those sections' defaults: ``configs/default.py``
    builds ``neural_solver`` from the fields and ``deq.neural_solver`` from the
    `BUDGET_FIELDS` (every budget of a run lives in ``config.deq``).

    Attributes:
      deq_workdir: the trained DEQ's workdir; non-empty makes ``launch.main`` train a
        solver for it instead of training a DEQ.
      m, hidden, kernel_size, pool: the `neural_solver` network.
      anderson_tail: past the ``unroll_steps`` it was trained on, the solver hands over
        to plain Anderson on its history (`neural_solver`'s ``anderson_after``).
      learn_beta: the network predicts the damping ``beta`` (the paper's solver);
        ``False`` fixes ``beta = 1``, the undamped update that skips a pass over the
        stored residuals every step (`neural_solver`'s ``beta``). The least-squares
        ablation always learns its ``beta``.
      init_hidden: channels of a sequence initialiser's convolution (0: the state's).
      init_kernel_size: the initialiser's convolution width (sequences and images).
      tol, max_iter: the trained solver's stopping tolerance and default budget.
      unroll_steps: ``K``, HyperAnderson steps unrolled in training. Past ``K`` the
        network meets iterates it was never trained on: let ``K`` cover the steps
        where the task's answers are decided (20 for prefix sums and mazes: 1.75x and
        1.7x fewer steps than Anderson, against 1.2x and 1.0x with ``K = 10``).
      train_steps: optimisation steps of a solver fit.
      detached_steps: how many of the ``train_steps`` (the first ones) treat each image
        ``f(z_k)`` of the unroll as a constant: the gradient still flows through the
        mixing, the network and the iterates, but no backward pass runs through the
        cell, so such a step is several times cheaper. The remaining steps
        backpropagate through the cell. A fit of another length (the fine-tunings of
        ``alternating``) detaches the same fraction of its steps.
      batch_size: examples per training batch.
      target_batches: batches in the pool of known fixed points (cycled through).
      target_max_iter, target_tol: the Anderson solve giving the fixed points.
      max_target_residual: the largest mean relative residual of the fixed points
        accepted (a larger one stops the run: the DEQ does not converge).
      learning_rate: Adam's learning rate (cosine-decayed to 10% over the fit).
      l1, l2, l3: the loss weights (``l3`` decays linearly to 0).
      ablations: also fit the ablations (no initialiser; least-squares alpha).
      seed: seeds the networks and the data order.
      alternating: in DEQ training, alternate DEQ and solver training (Appendix D).
      alt_warmup_steps: DEQ steps before the first solver fit.
      alt_deq_steps: DEQ steps between solver fine-tunings (``M``).
      alt_finetune_steps: solver steps of each fine-tuning (``T``).
    """

    deq_workdir: str = ""
    m: int = 5
    hidden: int = 32
    kernel_size: int = 3
    pool: str = "mean"
    anderson_tail: bool = False
    learn_beta: bool = True
    init_hidden: int = 0
    init_kernel_size: int = 3
    tol: float = 1e-3
    max_iter: int = 30
    unroll_steps: int = 6
    train_steps: int = 300
    detached_steps: int = 0
    batch_size: int = 32
    target_batches: int = 8
    target_max_iter: int = 80
    target_tol: float = 1e-6
    max_target_residual: float = 1e-2
    learning_rate: float = 1e-3
    l1: float = 1.0
    l2: float = 1.0
    l3: float = 0.1
    ablations: bool = False
    seed: int = 0
    alternating: bool = False
    alt_warmup_steps: int = 500
    alt_deq_steps: int = 500
    alt_finetune_steps: int = 50

    def __post_init__(self):
        positive = ("m", "hidden", "kernel_size", "max_iter", "unroll_steps", "train_steps")
        positive += ("batch_size", "target_batches", "target_max_iter", "alt_deq_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"neural_solver.{name} must be >= 1, got {getattr(self, name)}.")
        if not 0 <= self.detached_steps <= self.train_steps:
            raise ValueError(
                f"neural_solver.detached_steps must lie in [0, train_steps={self.train_steps}], "
                f"got {self.detached_steps}."
            )

    @classmethod
    def from_config(cls, section: Any) -> NeuralSolverSpec:
        """From one section of all its fields (e.g. a fit report's ``spec``); missing
        fields take the defaults above."""
        return from_section(cls, section, "neural_solver")

    @classmethod
    def from_run_config(cls, config: Any) -> NeuralSolverSpec:
        """From a run's config: ``neural_solver`` (the solver and its fit) and the
        budgets in ``deq.neural_solver`` (where every budget of a run lives).

        Raises:
          ValueError: for a budget left in ``neural_solver`` (naming its new key) or an
            unknown field.
        """
        section = dict(config.get("neural_solver", {}))
        for key in BUDGET_FIELDS:
            if key in section:
                raise ValueError(
                    f"config.neural_solver.{key} has moved to config.deq.neural_solver.{key} "
                    "(every budget and tolerance of a run lives in config.deq)."
                )
        budgets = dict(config.get("deq", {}).get("neural_solver", {}))
        return from_section(cls, {**section, **budgets}, "neural_solver")

    def detached_count(self, num_steps: int) -> int:
        """How many of a ``num_steps`` fit's first steps skip the cell's backward pass.

        ``detached_steps`` for a fit of ``train_steps``; the same fraction (rounded) for
        a fit of another length, e.g. a fine-tuning of the alternating mode.
        """
        return round(num_steps * self.detached_steps / self.train_steps)

    def init_options(self, state_shape: StateShape) -> dict[str, Any]:
        """The initialiser's keywords for this state (see `make_initializer`)."""
        kind = initializer_kind(state_shape)
        if kind == "sequence":
            return {"hidden": self.init_hidden or None, "kernel_size": self.init_kernel_size}
        if kind in ("image", "multiscale"):
            return {"kernel_size": self.init_kernel_size}
        return {}

    def untrained_solver(
        self, key: jax.Array, state_shape: StateShape, alpha_mode: str = "learned"
    ) -> neural_solver:
        """A fresh `neural_solver` with this section's network and stopping rule."""
        return init_neural_solver(
            key,
            state_shape,
            m=self.m,
            hidden=self.hidden,
            kernel_size=self.kernel_size,
            pool=self.pool,
            alpha_mode=alpha_mode,
            anderson_after=self.unroll_steps if self.anderson_tail else None,
            beta=None if self.learn_beta or alpha_mode == "least_squares" else 1.0,
            tol=self.tol,
            max_iter=self.max_iter,
        )

    def initializer(self, state_shape: StateShape) -> nn.Module:
        """The ``h_phi`` module for this state."""
        kind = initializer_kind(state_shape)
        features = initializer_features(state_shape)
        return make_initializer(kind, features, **self.init_options(state_shape))

    def learned_init(self, state_shape: StateShape, params: Any) -> LearnedInit:
        """Trained ``h_phi`` variables frozen into a `LearnedInit` for this state."""
        return learned_init(state_shape, params, **self.init_options(state_shape))

    def target_solver(self) -> anderson:
        """The classic solver whose long runs give the fixed points."""
        return anderson(tol=self.target_tol, max_iter=self.target_max_iter)


# The fields of `NeuralSolverSpec` that a run's config keeps in ``deq.neural_solver``.
BUDGET_FIELDS = ("tol", "max_iter", "target_tol", "target_max_iter")


class SolverFit(NamedTuple):
    """A fitted solver.

    Attributes:
      solver: the trained `neural_solver`.
      init: the trained `LearnedInit`, or ``None`` without an initialiser.
      losses: the training loss per step.
      seconds: wall time of the fit (training only).
    """

    solver: neural_solver
    init: LearnedInit | None
    losses: np.ndarray
    seconds: float


def collect_targets(
    frozen: FrozenDEQ,
    batches: Iterator[dict[str, Any]],
    count: int,
    max_residual: float,
    emit: Callable[[str], None] = print,
) -> list[Targets]:
    """``count`` batches of known fixed points, their residual checked.

    Raises:
      ValueError: if the mean relative residual of the fixed points exceeds
        ``max_residual`` (the DEQ does not converge well enough to teach a solver).
    """
    pool = [frozen.targets(b) for b in itertools.islice(batches, count)]
    rel = np.concatenate([t.rel_residual for t in pool])
    emit(
        f"fixed points of {len(rel)} examples: relative residual mean {rel.mean():.2e}, "
        f"max {rel.max():.2e} ({frozen.target_solver.max_iter} Anderson steps)"
    )
    if not rel.mean() <= max_residual:
        raise ValueError(
            f"The target solve leaves a mean relative residual {rel.mean():.2e} > "
            f"neural_solver.max_target_residual={max_residual:g}: raise "
            "deq.neural_solver.target_max_iter, or train a more stable DEQ."
        )
    return pool


def fit(
    spec: NeuralSolverSpec,
    frozen: FrozenDEQ,
    pool: list[Targets],
    *,
    num_steps: int,
    alpha_mode: str = "learned",
    use_init: bool = True,
    start: SolverFit | None = None,
    emit: Callable[[str], None] | None = None,
) -> SolverFit:
    """Trains a solver (and initialiser) for ``frozen``'s state on ``pool``.

    Args:
      spec: the config section.
      frozen: the frozen model (``f``).
      pool: the known fixed points (`collect_targets`), cycled through.
      num_steps: optimisation steps.
      alpha_mode: ``"learned"`` or ``"least_squares"`` (see `neural_solver`).
      use_init: train an initialiser (``False``: start at zero).
      start: a previous fit to continue (fine-tuning); its hyper-parameters win.
      emit: receives a progress line (step, loss, elapsed time) about every tenth of
        the fit; ``None``: silent.

    Returns:
      A `SolverFit`.
    """
    key = jax.random.PRNGKey(spec.seed)
    state_shape = state_shape_of(pool[0].z_star)
    if start is not None:
        solver = start.solver
        init_params = None if start.init is None else start.init.params.tree
    else:
        solver = spec.untrained_solver(key, state_shape, alpha_mode)
        init_params = None
    initializer = spec.initializer(state_shape) if use_init else None
    data = ((t.args, t.x, t.z_star) for t in itertools.cycle(pool))
    schedule = optax.cosine_decay_schedule(spec.learning_rate, num_steps, alpha=0.1)
    began = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        emit(f"  fit step {step}/{num_steps}  loss {loss:.4g}  {time.perf_counter() - began:.0f} s")

    trained = train_neural_solver(
        solver,
        initializer,
        frozen.f,
        data,
        num_steps=num_steps,
        key=jax.random.fold_in(key, 1),
        steps=spec.unroll_steps,
        optimizer=optax.adam(schedule),
        l1=spec.l1,
        l2=spec.l2,
        l3=spec.l3 if start is None else 0.0,
        init_params=init_params,
        on_step=None if emit is None else progress,
        log_every=max(1, num_steps // 10),
        detached_steps=spec.detached_count(num_steps),
    )
    jax.block_until_ready(trained.solver.variables)
    seconds = time.perf_counter() - began
    init = None if initializer is None else spec.learned_init(state_shape, trained.init_params)
    return SolverFit(trained.solver, init, trained.losses, seconds)
