"""The HyperDEQ training objective: unrolled HyperAnderson steps against known fixed points.

With the DEQ frozen and its fixed points ``z*`` known (from a long classic solve),
the initialiser ``h_phi`` and the HyperAnderson network are trained by unrolling ``K``
steps from ``z_0 = h_phi(x)`` (differentiably, with `jax.lax.scan`) and minimising

    l1 * sum_k w_k e(z_k)  +  l2 * e(z_0)  +  l3 * sum_k ||G_k alpha_k||^2,

with ``e(z) = ||z - z*||^2`` per sample (``error="absolute"``, the paper's) or
``||z - z*||^2 / ||z*||^2`` (``"relative"``: every sample weighs alike whatever the
size of its state), averaged over the batch; ``"log"`` takes the logarithm of that
batch mean of relative errors, so that every tenfold reduction counts alike at every
step and the tail, where the errors are small, keeps its share of the gradient. The
weights ``w_k`` grow linearly with ``k`` and sum to one (later iterates matter more);
the last term, Anderson's own objective, guides the early training of ``alpha`` and is
decayed (`alpha_weight`: the paper's ``l3`` goes linearly to ~5e-8 over the first
1.5-2k of its 4-5k steps). The paper's weights are ``l1 : l2 : l3 = 0.1 : 0.05 :
1e-4`` (language; ``0.1 : 0.02 : 1e-5`` for images). As in the paper (its Figure 3),
``h_phi`` learns from its own term only: the unroll starts from ``z_0`` with its
gradient stopped (``detach_init``).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax import _flat
from deq_jax.neural_solver.solver import neural_solver


class Unrolled(NamedTuple):
    """``K`` unrolled HyperAnderson steps (leading axis ``K``)."""

    zs: jax.Array  # [K, B, D] iterates z_1 .. z_K
    mixed_residual_sq: jax.Array  # [K, B] ||G_k alpha_k||^2
    alphas: jax.Array  # [K, B, m + 1] in ring order
    betas: jax.Array  # [K, B]


def step_weights(steps: int, dtype: Any = jnp.float32) -> jax.Array:
    """``w_k = k / sum_j j`` for ``k = 1..steps``: increasing, summing to one, ``[steps]``."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}.")
    k = jnp.arange(1, steps + 1, dtype=dtype)
    return k / jnp.sum(k)


# How an iterate's distance to ``z*`` is measured (`step_errors`).
ERRORS = ("absolute", "relative", "log")

# The paper's loss weights (Table 2, the language model): l1 (convergence), l2
# (initialiser), l3 (alpha, at the start of its decay) and where l3 ends.
PAPER_WEIGHTS = {"l1": 0.1, "l2": 0.05, "l3": 1e-4, "l3_final": 5e-8}


def linear_decay(value: float, step: int, total: int, final: float = 0.0) -> float:
    """``value`` at ``step = 0`` going linearly to ``final`` at ``step >= total``.

    The schedule of ``l3`` (the ``||G alpha||^2`` term) over training.
    """
    if total < 1:
        raise ValueError(f"total must be >= 1, got {total!r}.")
    frac = min(max(step / total, 0.0), 1.0)
    return value + (final - value) * frac


def alpha_weight(
    value: float, step: int, num_steps: int, fraction: float = 1.0, final: float = 0.0
) -> float:
    """``l3`` at fit step ``step`` (from 0) of ``num_steps``: ``value`` decaying linearly
    to ``final`` over the first ``fraction`` of the fit, then ``final``.

    The paper decays its ``l3`` to 5e-8 over the first 1.5-2k of 4-5k steps
    (``fraction`` ~0.4).

    Raises:
      ValueError: if ``fraction`` is not in ``(0, 1]``.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}.")
    return linear_decay(value, step, max(1, round(fraction * num_steps)), final)


def step_errors(zs: jax.Array, target: jax.Array, error: str = "absolute") -> jax.Array:
    """Each sample's error of each iterate, ``zs [..., B, D]`` against ``target [B, D]``:
    ``||z - z*||^2`` (``"absolute"``) or ``||z - z*||^2 / ||z*||^2`` (``"relative"``
    and ``"log"``, whose logarithm `batch_error` takes after the batch mean), shape
    ``[..., B]``.

    Raises:
      ValueError: for another ``error``.
    """
    if error not in ERRORS:
        raise ValueError(f"error must be one of {', '.join(ERRORS)}, got {error!r}.")
    sq = jnp.sum((zs - target) ** 2, axis=-1)
    if error == "absolute":
        return sq
    scale = jnp.sum(target**2, axis=-1)
    return sq / jnp.maximum(scale, jnp.finfo(sq.dtype).tiny)


def batch_error(zs: jax.Array, target: jax.Array, error: str = "absolute") -> jax.Array:
    """The batch mean of `step_errors`, ``[...]``; for ``"log"`` its logarithm (of the
    mean relative error, floored at float32's smallest normal number)."""
    mean = jnp.mean(step_errors(zs, target, error), axis=-1)
    if error != "log":
        return mean
    return jnp.log(jnp.maximum(mean, jnp.finfo(mean.dtype).tiny))


def unroll(
    solver: neural_solver,
    params: Any,
    fn: Callable[[jax.Array], jax.Array],
    z0: jax.Array,
    steps: int,
    cell_gradient: bool = True,
) -> Unrolled:
    """``steps`` HyperAnderson steps from ``z0 [B, D]``, reverse-differentiable.

    Only learned steps are unrolled: a solver's Anderson hand-over (``anderson_after``)
    is a solve-time composition, not trained.

    Args:
      solver: supplies the hyper-parameters (its own weights are not used).
      params: the network's variables, possibly traced (the ones being trained).
      fn: the frozen map ``[B, D] -> [B, D]``.
      z0: the first iterate.
      steps: ``K``, the number of proposals (``K`` evaluations of ``fn``).
      cell_gradient: differentiate through ``fn``. ``False`` treats every image
        ``fn(z_k)`` as a constant: the gradient still flows through the mixing, the
        network and the iterates ``z_k`` in the residuals ``fn(z_k) - z_k``, but no
        backward pass runs through the cell, which makes a training step several
        times cheaper.

    Returns:
      `Unrolled` with the iterates ``z_1 .. z_K``.
    """

    def body(carry, k):
        z, aux = carry
        fz = fn(z) if cell_gradient else jax.lax.stop_gradient(fn(jax.lax.stop_gradient(z)))
        out = solver.step(params, aux, z, fz, k)
        sq = jnp.sum(out.mixed_residual**2, axis=-1)
        return (out.z_next, out.state), (out.z_next, sq, out.alpha, out.beta)

    carry = (z0, solver.learned_init(z0))
    ks = jnp.arange(1, steps + 1, dtype=jnp.int32)
    _, (zs, sq, alphas, betas) = jax.lax.scan(body, carry, ks)
    return Unrolled(zs, sq, alphas, betas)


def neural_solver_loss(
    params: Any,
    solver: neural_solver,
    initializer: nn.Module | None,
    f: Callable[[jax.Array, Any], jax.Array],
    args: Any,
    x: jax.Array,
    z_star: Any,
    *,
    steps: int,
    l1: float = PAPER_WEIGHTS["l1"],
    l2: float = PAPER_WEIGHTS["l2"],
    l3: float | jax.Array = 0.0,
    cell_gradient: bool = True,
    detach_init: bool = True,
    error: str = "absolute",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The HyperDEQ loss of one batch and its parts.

    Args:
      params: ``{"solver": network variables, "init": initialiser variables}``.
      solver: the `neural_solver` giving the hyper-parameters.
      initializer: the ``h_phi`` module (`deq_jax.neural_solver.make_initializer`), or
        ``None`` to start every solve at zero (the "no initialiser" ablation; the
        initialisation term is then a constant).
      f: the frozen cell, ``f(z, args) -> z`` on states ``[B, *state_shape]`` (a tuple
        of such arrays for a multiscale state).
      args: the cell's arguments (no gradient reaches them).
      x: the injection ``h_phi`` reads.
      z_star: the known fixed points ``[B, *state_shape]`` (or a tuple of them).
      steps: ``K`` unrolled steps.
      l1, l2, l3: weights of the convergence, initialisation and ``||G alpha||^2``
        terms.
      cell_gradient: backpropagate through the cell in the unrolled steps (see
        `unroll`).
      detach_init: start the unroll from ``z_0`` with its gradient stopped, so that
        ``h_phi`` learns from the ``l2`` term alone (the paper); ``False`` lets the
        convergence and ``||G alpha||^2`` terms train it too.
      error: ``"absolute"``, ``"relative"`` or ``"log"`` (see `step_errors` and
        `batch_error`), for the convergence and initialisation terms.

    Returns:
      ``(loss, metrics)`` with metrics ``conv``, ``init``, ``alpha`` (the three terms
      before weighting) and ``final_rel_error`` (``||z_K - z*|| / ||z*||``, batch mean).

    Raises:
      ValueError: if ``h_phi(x)`` does not have the structure and shapes of ``z_star``,
        or for an unknown ``error``.
    """
    if error not in ERRORS:
        raise ValueError(f"error must be one of {', '.join(ERRORS)}, got {error!r}.")
    args = jax.lax.stop_gradient(args)
    z_star = jax.lax.stop_gradient(z_star)
    if initializer is None:
        z0 = jax.tree_util.tree_map(jnp.zeros_like, z_star)
    else:
        z0 = initializer.apply(params["init"], x)
    if not _flat.same_specs(jax.eval_shape(lambda: z0), jax.eval_shape(lambda: z_star)):
        raise ValueError(
            f"The initialiser maps x {x.shape} to {_flat.describe(z0)}, but z_star is "
            f"{_flat.describe(z_star)}."
        )
    layout = _flat.layout_of(z_star, batched=True)
    fn = _flat.flat_fn(f, layout, args)  # [B, D] -> [B, D]
    target = _flat.flatten(z_star, layout)
    z0_flat = _flat.flatten(z0, layout)
    start = jax.lax.stop_gradient(z0_flat) if detach_init else z0_flat
    out = unroll(solver, params["solver"], fn, start, steps, cell_gradient)
    err = batch_error(out.zs, target, error)  # [K]
    conv = jnp.sum(step_weights(steps, err.dtype) * err)
    init = batch_error(z0_flat, target, error)
    alpha = jnp.sum(jnp.mean(out.mixed_residual_sq, axis=-1))
    loss = l1 * conv + l2 * init + l3 * alpha
    final = jnp.linalg.norm(out.zs[-1] - target, axis=-1) / jnp.linalg.norm(target, axis=-1)
    metrics = {"conv": conv, "init": init, "alpha": alpha, "final_rel_error": jnp.mean(final)}
    return loss, metrics
