"""What happens along a solve: the solver's iterates replayed and observed step by step.

The library's solve (`deq_jax.solvers.loop.iterate`) keeps only the residual trace. To
ask *when* something happened during the solve (when the decoded answer stopped
changing, when the worst part of the state converged), `solver_trajectory` replays the
same iterates (``z_1 = z0``, ``z_{k+1}`` the solver's proposal after evaluation ``k``,
through the loop's own step: `deq_jax.solvers.iterate_observed`) for a fixed number of
steps and stacks an observation of each. The loop's per-sample stopping only freezes
the bookkeeping of a stopped sample, not the iterates of the others (rows of the batch
are independent problems), so the replay follows the solve exactly up to float
rounding: compiled differently (a scan, not the loop), a long solve can pass its
tolerance a step earlier or later (CLRS's Prim, 40-96 steps: 81-94% of the graphs to
the step; Bellman-Ford, ~15 steps: all).

On top of it:

* `settle_step`: per sample, the first step from which an observation (say, the decoded
  output) no longer changes;
* `first_below`: per sample, the first step at which a residual is at most ``tol``;
* `node_residual`: the worst node's relative residual of a graph state, which, unlike
  the whole-state relative residual that the solvers stop on, does not shrink as a
  graph gets larger around the same number of unsettled nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax import _flat
from deq_jax.solvers.base import REL_EPS, Solver
from deq_jax.solvers.loop import iterate_observed


def solver_trajectory(
    f: Callable[[Any, Any], Any],
    z0: Any,
    args: Any,
    *,
    solver: Solver,
    observe: Callable[[Any, Any], Any],
    steps: int | None = None,
) -> Any:
    """Replays ``solver``'s iterates on ``f`` from ``z0`` and observes every one.

    Args:
      f: the map ``f(z, args) -> z``, batched along axis 0 (a `deq_jax.nn.EquilibriumProblem`'s).
      z0: the initial state, a batched pytree.
      args: the map's arguments.
      solver: the solver whose iterates are replayed (its ``tol`` is not used: every
        sample runs all ``steps``).
      observe: ``observe(z, fz) -> pytree`` of one iterate ``z`` and its image
        ``fz = f(z, args)`` (both pytrees like ``z0``); every leaf has the batch axis first.
      steps: evaluations of ``f`` to replay (``None``: ``solver.max_iter``).

    Returns:
      The observations stacked along a new axis 1: leaves ``[B, steps, ...]``; index
      ``k - 1`` observes the ``k``-th iterate (index 0 is ``z0``).

    Raises:
      ValueError: if ``steps`` is not an integer >= 1.
    """
    steps = solver.max_iter if steps is None else steps
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}.")
    layout = _flat.layout_of(z0, _flat.infer_batched(z0))
    fn = _flat.flat_fn(f, layout, args)
    unflat = lambda flat: _flat.unflatten(flat, layout)
    return iterate_observed(
        solver, fn, _flat.flatten(z0, layout), steps, lambda z, fz: observe(unflat(z), unflat(fz))
    )


def settle_step(
    values: jax.Array, final: jax.Array | None = None, until: jax.Array | None = None
) -> jax.Array:
    """Per sample, the first step from which ``values`` equal ``final`` at every later step.

    Args:
      values: ``[B, K, ...]``, one observation per step (e.g. decoded pointers).
      final: ``[B, ...]``, the settled value (``None``: the last step's).
      until: ``[B]`` optional last step (1-based) that counts, e.g. the solver's
        ``nstep``: a replay runs on past the solver's stop, and what the iterates do
        there is not the answer the solver returned.

    Returns:
      ``[B]`` int32 steps in ``1..K`` (1-based like `deq_jax.SolverStats.nstep`); the
      last counted step (``K`` or ``until``) also when that step differs from ``final``
      (the value never settled).
    """
    final = values[:, -1] if final is None else final
    same = values == final[:, None]
    same = same.reshape(*same.shape[:2], -1).all(-1)  # [B, K]
    k = values.shape[1]
    last = jnp.full(same.shape[:1], k) if until is None else jnp.clip(until, 1, k)
    same = same | (jnp.arange(1, k + 1)[None, :] > last[:, None])  # steps past the stop
    # the number of trailing equal steps: a reversed cumulative product
    tail = jnp.cumprod(same[:, ::-1].astype(jnp.int32), axis=1).sum(1)
    return jnp.minimum(k - tail + 1, last).astype(jnp.int32)


def first_below(residuals: jax.Array, tol: float) -> jax.Array:
    """Per sample, the first step (1-based) at which ``residuals [B, K]`` is at most
    ``tol``; ``K`` if none is (the solver's ``nstep`` under that stopping rule)."""
    below = residuals <= tol
    k = residuals.shape[1]
    return jnp.where(below.any(1), jnp.argmax(below, axis=1) + 1, k).astype(jnp.int32)


def node_residual(z: Any, fz: Any, num_nodes: int) -> jax.Array:
    """The worst node's relative residual of a batch of graph states, ``[B]``.

    Every leaf of ``z`` is ``[B, n, ...]`` with the node axis first after the batch (an
    edge state ``[B, n, n, F]`` counts row ``i`` towards node ``i``). Node ``i``'s
    residual is ``||f(z)_i - z_i||`` and the result is the largest over nodes, relative
    to the root-mean-square node norm of ``f(z)``:
    ``max_i ||f(z)_i - z_i|| / (||f(z)|| / sqrt(n))``. It equals the whole-state relative
    residual ``||f(z) - z|| / ||f(z)||`` when every node moves alike, and stays the same
    when a graph grows around the same few moving nodes, where the whole-state one falls
    by ``sqrt(n)``.

    Raises:
      ValueError: if a leaf has no node axis of length ``num_nodes``.
    """

    def per_node_sq(tree):
        total = 0.0
        for leaf in jax.tree_util.tree_leaves(tree):
            if leaf.ndim < 2 or leaf.shape[1] != num_nodes:
                raise ValueError(
                    f"node_residual needs leaves [B, {num_nodes}, ...], got shape {leaf.shape}."
                )
            total = total + jnp.sum(jnp.square(leaf.reshape(*leaf.shape[:2], -1)), -1)
        return total  # [B, n]

    moved = per_node_sq(jax.tree_util.tree_map(lambda a, b: a - b, fz, z))
    scale = jnp.sqrt(per_node_sq(fz).sum(-1) / num_nodes) + REL_EPS
    return jnp.sqrt(moved.max(-1)) / scale
