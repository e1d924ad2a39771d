"""`train_neural_solver`: fits ``h_phi`` and HyperAnderson to a frozen DEQ with optax.

A small, self-contained loop over batches of ``(cell args, injection, z*)``: one jitted
Adam step on `deq_jax.neural_solver.neural_solver_loss` per batch, with the paper's
weights by default and the ``||G alpha||^2`` weight decayed linearly over the first part
of the run (`deq_jax.neural_solver.loss.alpha_weight`). It returns the trained solver
(weights frozen into a new `neural_solver`) and the initialiser's variables.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax

from deq_jax.neural_solver.loss import PAPER_WEIGHTS, alpha_weight, neural_solver_loss
from deq_jax.neural_solver.solver import neural_solver


class TrainedNeuralSolver(NamedTuple):
    """The result of `train_neural_solver`.

    Attributes:
      solver: the `neural_solver` with the trained network weights.
      init_params: the trained initialiser's variables (``initializer.apply(init_params, x)``;
        ``None`` without an initialiser).
      losses: ``[num_steps]`` training loss per step (host array).
    """

    solver: neural_solver
    init_params: Any
    losses: np.ndarray


def train_neural_solver(
    solver: neural_solver,
    initializer: nn.Module | None,
    f: Callable[[Any, Any], Any],
    batches: Iterable[tuple[Any, Any, Any]],
    *,
    num_steps: int,
    key: jax.Array,
    steps: int = 6,
    optimizer: optax.GradientTransformation | None = None,
    l1: float = PAPER_WEIGHTS["l1"],
    l2: float = PAPER_WEIGHTS["l2"],
    l3: float = PAPER_WEIGHTS["l3"],
    l3_final: float = PAPER_WEIGHTS["l3_final"],
    l3_decay: float = 0.4,
    init_params: Any = None,
    on_step: Callable[[int, float], None] | None = None,
    log_every: int = 0,
    detached_steps: int = 0,
    detach_init: bool = True,
    error: str = "absolute",
) -> TrainedNeuralSolver:
    """Trains the solver's network and the initialiser on a frozen cell.

    Args:
      solver: the starting `neural_solver` (e.g. `init_neural_solver`); its weights are
        the starting point and its hyper-parameters are kept.
      initializer: the ``h_phi`` module, or ``None`` to start at zero (no initialiser).
      f: the frozen cell ``f(z, args) -> z`` on states ``[B, *state_shape]``.
      batches: yields ``(args, x, z_star)``: the cell's arguments, the injection read
        by ``h_phi`` and the known fixed points; at least ``num_steps`` batches of a
        fixed shape (one compilation).
      num_steps: optimisation steps.
      key: PRNG key of the initialiser's variables (when ``init_params`` is ``None``).
      steps: ``K``, the unrolled HyperAnderson steps per example.
      optimizer: an optax optimiser; Adam with learning rate ``1e-3`` by default.
      l1, l2: weights of the convergence and initialisation terms (the paper's 0.1
        and 0.05 by default).
      l3: starting weight of the ``||G alpha||^2`` term (the paper's 1e-4), decayed
        linearly to ``l3_final`` (its 5e-8) over the first ``l3_decay`` of the steps
        (`alpha_weight`).
      l3_final, l3_decay: see ``l3``.
      init_params: starting initialiser variables, if any.
      on_step: called as ``on_step(step, loss)`` (``step`` counted from one) every
        ``log_every`` steps and after the last one, e.g. to print progress.
      log_every: how often ``on_step`` is called (``0``: only after the last step).
      detached_steps: the first ``detached_steps`` optimisation steps treat each image
        ``f(z_k)`` of the unroll as a constant (no backward pass through ``f``, so
        several times cheaper; see `deq_jax.neural_solver.loss.unroll`); the rest
        backpropagate through ``f``.
      detach_init, error: see `neural_solver_loss` (``h_phi`` trained by its own term;
        the absolute error).

    Returns:
      A `TrainedNeuralSolver`.

    Raises:
      ValueError: if ``batches`` runs out before ``num_steps``, or ``detached_steps``
        is not in ``[0, num_steps]``.
    """
    if not isinstance(detached_steps, int) or not 0 <= detached_steps <= num_steps:
        raise ValueError(
            f"detached_steps must be an integer in [0, num_steps={num_steps}], "
            f"got {detached_steps!r}."
        )
    if optimizer is None:
        optimizer = optax.adam(1e-3)
    it = iter(batches)
    first = next(it, None)
    if first is None:
        raise ValueError("batches is empty.")
    if init_params is None and initializer is not None:
        init_params = initializer.init(key, first[1])
    params = {"solver": solver.variables, "init": init_params}
    opt_state = optimizer.init(params)

    terms = dict(steps=steps, l1=l1, l2=l2, detach_init=detach_init, error=error)
    update = _make_update(solver, initializer, f, optimizer, **terms)
    alpha = functools.partial(
        alpha_weight, l3, num_steps=num_steps, fraction=l3_decay, final=l3_final
    )
    schedule = _Schedule(num_steps, alpha, detached_steps, on_step, log_every)
    params, losses = _optimise(update, params, opt_state, itertools.chain([first], it), schedule)
    return TrainedNeuralSolver(
        solver=solver.with_params(params["solver"]),
        init_params=params["init"],
        losses=losses,
    )


class _Schedule(NamedTuple):
    """How `_optimise` runs: steps, ``l3`` per step, the detached steps, the logging."""

    num_steps: int
    l3: Callable[[int], float]
    detached_steps: int
    on_step: Callable[[int, float], None] | None
    log_every: int


def _optimise(
    update: Callable[..., tuple[Any, Any, jax.Array]],
    params: Any,
    opt_state: Any,
    batches: Iterator[tuple[Any, Any, Any]],
    schedule: _Schedule,
) -> tuple[Any, np.ndarray]:
    """Runs ``schedule.num_steps`` of ``update`` on ``batches``; returns the parameters and
    the loss per step (host array).

    Raises:
      ValueError: if ``batches`` runs out first.
    """
    num_steps, log_every, on_step = schedule.num_steps, schedule.log_every, schedule.on_step
    losses = []
    for step in range(num_steps):
        batch = next(batches, None)
        if batch is None:
            raise ValueError(f"batches ran out after {step} of {num_steps} steps.")
        l3_now = schedule.l3(step)
        detached = step < schedule.detached_steps
        params, opt_state, loss = update(params, opt_state, batch, l3_now, not detached)
        # Waits for the step, so that the next batch's target solve is timed alone
        # (`deq_jax.training.solver_fit.targets.TargetStream`).
        losses.append(float(loss))
        done = step + 1
        if on_step is not None and (done == num_steps or (log_every and done % log_every == 0)):
            on_step(done, float(loss))
    return params, np.asarray(losses, np.float32)


def _make_update(
    solver: neural_solver,
    initializer: nn.Module | None,
    f: Callable[[Any, Any], Any],
    optimizer: optax.GradientTransformation,
    **terms: Any,
) -> Callable[..., tuple[Any, Any, jax.Array]]:
    """The jitted optimisation step ``update(params, opt_state, batch, l3, cell_gradient)
    -> (params, opt_state, loss)`` on `neural_solver_loss` with ``terms`` (``steps``,
    the weights, ``detach_init``, ``error``; ``cell_gradient`` static)."""

    @functools.partial(jax.jit, static_argnums=4)
    def update(params, opt_state, batch, l3_now, cell_gradient):
        args, x, z_star = batch
        loss_fn = lambda p: neural_solver_loss(
            p,
            solver,
            initializer,
            f,
            args,
            x,
            z_star,
            l3=l3_now,
            cell_gradient=cell_gradient,
            **terms,
        )
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return update
