"""Fitting a neural solver to a frozen task model, from the ``neural_solver`` config section.

Shared by the solver's own run (`deq_jax.training.solver_fit.hypersolver`) and by the alternating
mode of DEQ training (`deq_jax.training.solver_fit.alternating`):

* `NeuralSolverSpec`: the config section as a dataclass (`NeuralSolverSpec.from_config`);
  its defaults are the paper's recipe (loss weights, ``l3`` decayed over the first 40%
  of the fit, ``h_phi`` trained by its own term, BPTT through all ``K`` steps, 1,000
  steps on fresh batches);
* `TargetStream`: the ``(args, x, z*)`` batches of a fit from a `FrozenDEQ`, each solved
  as the fit asks for it (fresh batches) or a pool solved up front and cycled
  (`collect_targets`), the target solve's residual checked (`TargetResidualError`);
* `fit`: builds (or continues) a solver and an initialiser for the model's state and
  trains them on those batches (`train_neural_solver`), timed.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2, App. D).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax

from deq_jax._sections import from_section
from deq_jax.neural_solver.initializer import LearnedInit, make_initializer
from deq_jax.neural_solver.loss import ERRORS, PAPER_WEIGHTS
from deq_jax.neural_solver.solver import init_neural_solver, neural_solver
from deq_jax.neural_solver.state_shape import StateShape, state_shape_of
from deq_jax.solvers.anderson import anderson
from deq_jax.training.solver_fit.frozen_deq import (
    FrozenDEQ,
    Targets,
    initializer_features,
    initializer_kind,
    learned_init,
)
from deq_jax.training.solver_fit.targets import TargetStream
from deq_jax.training.solver_fit.trainer import train_neural_solver


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
        to plain Anderson on its history (`neural_solver`'s ``anderson_after``); on by
        default (issue 79: the same solves up to ``K``, and at ``2K`` a residual at
        Anderson's instead of 20-45x above it); ``False`` keeps the learned update.
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
      train_steps: optimisation steps of a solver fit (the paper: 3,000-5,000).
      detached_steps: how many of the ``train_steps`` (the first ones) treat each image
        ``f(z_k)`` of the unroll as a constant: the gradient still flows through the
        mixing, the network and the iterates, but no backward pass runs through the
        cell, so such a step is several times cheaper. The remaining steps
        backpropagate through the cell (0, the paper's: all of them). A fit of another
        length (the fine-tunings of ``alternating``) detaches the same fraction.
      batch_size: examples per training batch.
      fresh_batches: every fit step solves a new batch of the model's training data
        (the paper); ``False`` cycles a pool of ``target_batches`` batches solved up
        front.
      target_batches: batches in that pool.
      target_max_iter, target_tol: the Anderson solve giving the fixed points.
      max_target_residual: the largest mean relative residual of the fixed points
        accepted (a larger one stops the run in one line, `TargetResidualError`: the
        targets are not fixed points).
      learning_rate: Adam's learning rate (cosine-decayed to 10% over the fit).
      l1, l2, l3: the loss weights of the convergence, initialiser and
        ``||G alpha||^2`` terms (the paper's 0.1, 0.05, 1e-4).
      l3_final, l3_decay: ``l3`` decays linearly to ``l3_final`` (the paper's 5e-8)
        over the first ``l3_decay`` of the fit (0.4: its 2k of 5k steps).
      detach_init: ``h_phi`` learns from its own term only (the paper): the unroll
        starts from ``z_0`` with its gradient stopped. ``False``: the convergence and
        alpha terms train it too.
      error: ``"absolute"`` (the paper's ``||z_k - z*||^2``), ``"relative"`` (each
        sample's over ``||z*||^2``) or ``"log"`` (the log of the batch's mean relative
        error: the tail's steps keep their weight; `deq_jax.neural_solver.loss`).
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
    anderson_tail: bool = True
    learn_beta: bool = True
    init_hidden: int = 0
    init_kernel_size: int = 3
    tol: float = 1e-3
    max_iter: int = 30
    unroll_steps: int = 6
    train_steps: int = 1_000
    detached_steps: int = 0
    batch_size: int = 32
    fresh_batches: bool = True
    target_batches: int = 8
    target_max_iter: int = 80
    target_tol: float = 1e-6
    max_target_residual: float = 1e-3
    learning_rate: float = 1e-3
    l1: float = PAPER_WEIGHTS["l1"]
    l2: float = PAPER_WEIGHTS["l2"]
    l3: float = PAPER_WEIGHTS["l3"]
    l3_final: float = PAPER_WEIGHTS["l3_final"]
    l3_decay: float = 0.4
    detach_init: bool = True
    error: str = "absolute"
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
        if self.error not in ERRORS:
            raise ValueError(
                f"neural_solver.error must be one of {', '.join(ERRORS)}, got {self.error!r}."
            )
        if not 0 < self.l3_decay <= 1:
            raise ValueError(f"neural_solver.l3_decay must lie in (0, 1], got {self.l3_decay}.")

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

    def targets(
        self,
        frozen: FrozenDEQ,
        batches: Iterator[dict[str, Any]],
        emit: Callable[[str], None] | None = None,
    ) -> TargetStream:
        """The fit's known fixed points from ``batches``: fresh, or a pool of
        ``target_batches`` cycled (``fresh_batches``), checked against
        ``max_target_residual``.

        Raises:
          TargetResidualError: if the first targets are not fixed points.
        """
        pool = 0 if self.fresh_batches else self.target_batches
        return TargetStream(frozen, batches, self.max_target_residual, pool=pool, emit=emit)


# The fields of `NeuralSolverSpec` that a run's config keeps in ``deq.neural_solver``.
BUDGET_FIELDS = ("tol", "max_iter", "target_tol", "target_max_iter")


class SolverFit(NamedTuple):
    """A fitted solver.

    Attributes:
      solver: the trained `neural_solver`.
      init: the trained `LearnedInit`, or ``None`` without an initialiser.
      losses: the training loss per step.
      seconds: wall time of the fit: its steps, and the target solves of fresh
        batches (a pool's are solved before).
    """

    solver: neural_solver
    init: LearnedInit | None
    losses: np.ndarray
    seconds: float


def fit(
    spec: NeuralSolverSpec,
    frozen: FrozenDEQ,
    targets: Iterable[Targets],
    *,
    num_steps: int,
    alpha_mode: str = "learned",
    use_init: bool = True,
    start: SolverFit | None = None,
    emit: Callable[[str], None] | None = None,
) -> SolverFit:
    """Trains a solver (and initialiser) for ``frozen``'s state on ``targets``.

    Args:
      spec: the config section.
      frozen: the frozen model (``f``).
      targets: the known fixed points, one batch per step (`NeuralSolverSpec.targets`:
        fresh, or a pool cycled); a `TargetStream`'s target solves count in the fit's
        seconds.
      num_steps: optimisation steps.
      alpha_mode: ``"learned"`` or ``"least_squares"`` (see `neural_solver`).
      use_init: train an initialiser (``False``: start at zero).
      start: a previous fit to continue (fine-tuning); its hyper-parameters win, and
        ``l3`` is 0.
      emit: receives a progress line (step, loss, elapsed time) about every tenth of
        the fit; ``None``: silent.

    Returns:
      A `SolverFit`.
    """
    key = jax.random.PRNGKey(spec.seed)
    targets = iter(targets)
    first = next(targets)
    state_shape = state_shape_of(first.z_star)
    if start is not None:
        solver = start.solver
        init_params = None if start.init is None else start.init.params.tree
    else:
        solver = spec.untrained_solver(key, state_shape, alpha_mode)
        init_params = None
    initializer = spec.initializer(state_shape) if use_init else None
    data = ((t.args, t.x, t.z_star) for t in itertools.chain([first], targets))
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
        l3_final=spec.l3_final if start is None else 0.0,
        l3_decay=spec.l3_decay,
        init_params=init_params,
        on_step=None if emit is None else progress,
        log_every=max(1, num_steps // 10),
        detached_steps=spec.detached_count(num_steps),
        detach_init=spec.detach_init,
        error=spec.error,
    )
    jax.block_until_ready(trained.solver.variables)
    seconds = time.perf_counter() - began
    init = None if initializer is None else spec.learned_init(state_shape, trained.init_params)
    return SolverFit(trained.solver, init, trained.losses, seconds)
