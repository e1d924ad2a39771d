"""Losses along a solver trajectory: fixed-point correction and a step penalty.

A *trajectory* is a pytree shaped like the state with one extra leading axis: every
leaf is ``[T, B, ...]`` (``[T, ...]`` for an unbatched state), and ``trajectory[t]``
(the pytree of ``leaf[t]``) is the ``t``-th iterate. `unrolled_trajectory` builds one
from ``z0`` by damped fixed-point iteration and includes ``z0`` itself as iterate 0;
any stack of iterates (e.g. from a user's own loop) works the same way.

* `fixed_point_correction` applies a per-sample loss to every iterate and returns
  their weighted sum, with weights constant, linearly or exponentially increasing in
  ``t`` and normalised to sum to 1, so that late iterates count most.
* `step_penalty` is ``sum_t ||z_{t+1} - z_t||^2`` per sample, small when the
  iteration settles quickly.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (stabilising the path to the equilibrium, not only the equilibrium).
  Bai, Geng, Savani, Kolter, "Deep Equilibrium Optical Flow Estimation", CVPR 2022
  (fixed-point correction: a loss on intermediate iterates, weighted ``gamma^(T-t)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax import _flat

WEIGHTS = ("constant", "linear", "exponential")


def unrolled_trajectory(
    f: Callable[[Any, Any], Any], z0: Any, args: Any, steps: int, tau: float = 1.0
) -> Any:
    """Iterates ``z_{t+1} = (1 - tau) z_t + tau f(z_t, args)`` and stacks them.

    Runs under `jax.lax.scan`, so the trajectory is differentiable w.r.t. ``args``
    and ``z0`` by plain backpropagation through the ``steps`` iterations.

    Args:
      f: the cell, ``f(z, args) -> z`` with the same pytree structure as ``z``.
      z0: the initial state, a pytree of float arrays.
      args: the cell's other arguments.
      steps: iterations, ``>= 1``.
      tau: the damping, ``0 < tau <= 1`` (1 is plain fixed-point iteration).

    Returns:
      The trajectory: ``z0``'s pytree with leaves ``[steps + 1, ...]``; index 0 is
      ``z0``.

    Raises:
      ValueError: for ``steps < 1`` or ``tau`` outside ``(0, 1]``.

    References:
      Bai, Geng, Savani, Kolter, "Deep Equilibrium Optical Flow Estimation", CVPR 2022.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}.")
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must lie in (0, 1], got {tau!r}.")

    def step(z, _):
        fz = f(z, args)
        z_next = jax.tree_util.tree_map(lambda a, b: (1.0 - tau) * a + tau * b, z, fz)
        return z_next, z_next

    _, iterates = jax.lax.scan(step, z0, None, length=steps)
    return jax.tree_util.tree_map(lambda a, rest: jnp.concatenate([a[None], rest]), z0, iterates)


def trajectory_weights(
    length: int, weights: str | Sequence[float] = "exponential", gamma: float = 0.8
) -> jax.Array:
    """Weights of the ``length`` iterates of a trajectory, normalised to sum to 1.

    Args:
      length: the number of iterates ``T >= 1``.
      weights: ``"constant"`` (``1``), ``"linear"`` (``t + 1``), ``"exponential"``
        (``gamma^(T - 1 - t)``, as in DEQ optical flow), or ``T`` non-negative numbers.
      gamma: the decay of ``"exponential"``, ``0 < gamma <= 1``.

    Returns:
      ``[T]`` float32 weights summing to 1, non-decreasing in ``t`` for the named ones.

    Raises:
      ValueError: for an unknown name (the message lists the valid ones), a bad
        ``gamma``, or explicit weights of the wrong length, negative or all zero.
    """
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"A trajectory needs at least one iterate, got length {length!r}.")
    t = np.arange(length, dtype=np.float64)
    if isinstance(weights, str):
        if weights == "constant":
            w = np.ones(length)
        elif weights == "linear":
            w = t + 1.0
        elif weights == "exponential":
            if not 0.0 < gamma <= 1.0:
                raise ValueError(f"gamma must lie in (0, 1], got {gamma!r}.")
            w = gamma ** (length - 1 - t)
        else:
            raise ValueError(f"Unknown weights {weights!r}. Valid weights: {', '.join(WEIGHTS)}.")
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (length,) or np.any(w < 0) or not np.any(w > 0):
            raise ValueError(
                f"Explicit weights must be {length} non-negative numbers, not all zero; "
                f"got {weights!r}."
            )
    return jnp.asarray(w / w.sum(), jnp.float32)


def _length(trajectory: Any) -> int:
    leaves = jax.tree_util.tree_leaves(trajectory)
    if not leaves or any(np.ndim(x) < 1 for x in leaves):
        raise ValueError("A trajectory needs array leaves with a leading iterate axis [T, ...].")
    lengths = {np.shape(x)[0] for x in leaves}
    if len(lengths) != 1:
        raise ValueError(f"Every leaf of a trajectory needs the same length T, got {lengths}.")
    return lengths.pop()


def fixed_point_correction(
    trajectory: Any,
    target_fn: Callable[[Any], jax.Array],
    weights: str | Sequence[float] = "exponential",
    *,
    gamma: float = 0.8,
) -> jax.Array:
    """Weighted sum over iterates of a per-sample loss: ``sum_t w_t loss(z_t)``.

    Args:
      trajectory: a pytree with leaves ``[T, B, ...]`` (see the module docstring);
        drop iterate 0 (``z0``) first if it should not count.
      target_fn: maps one iterate (leaves ``[B, ...]``) to its per-sample loss ``[B]``
        (or a scalar), e.g. ``lambda z: ((head(z) - y) ** 2).mean(-1)``. It is mapped
        over ``t`` with `jax.vmap`.
      weights: ``"constant"``, ``"linear"``, ``"exponential"`` or ``T`` numbers; see
        `trajectory_weights`.
      gamma: the decay of exponential weights.

    Returns:
      ``[B]`` (or a scalar): the weighted loss, differentiable through ``target_fn``
      and the iterates.

    Raises:
      ValueError: for an empty trajectory or bad weights (listing the valid names).

    References:
      Bai, Geng, Savani, Kolter, "Deep Equilibrium Optical Flow Estimation", CVPR 2022.
    """
    w = trajectory_weights(_length(trajectory), weights, gamma)  # [T]
    losses = jax.vmap(target_fn)(trajectory)  # [T, B] or [T]
    w = w.astype(losses.dtype).reshape((-1,) + (1,) * (losses.ndim - 1))
    return jnp.sum(w * losses, axis=0)


def step_penalty(trajectory: Any, *, batched: bool | None = None) -> jax.Array:
    """``sum_t ||z_{t+1} - z_t||^2`` per sample, summed over the state's leaves.

    Args:
      trajectory: a pytree with leaves ``[T, B, ...]`` (``[T, ...]`` if unbatched).
      batched: whether the iterates have a batch axis after ``T``; ``None`` means
        batched unless a leaf of an iterate is a scalar.

    Returns:
      ``[B]`` for batched iterates, a scalar otherwise; 0 for ``T = 1``.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021.
    """
    _length(trajectory)
    first = jax.tree_util.tree_map(lambda x: x[0], trajectory)
    if batched is None:
        batched = _flat.infer_batched(first)
    keep = 2 if batched else 1  # the [T, B] or [T] axes

    def per_leaf(x):
        diff = jnp.diff(x, axis=0)  # [T - 1, B, ...]
        return jnp.sum(jnp.square(diff), axis=(0, *range(keep, diff.ndim)))

    return sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(per_leaf, trajectory)))
