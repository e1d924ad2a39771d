"""Explicit unrolls of equilibrium cells: a cell applied a fixed number of times.

The explicit counterparts of a `deq_jax.nn.DEQ`, with the same cell and parameters:

* `run_tied`: one cell applied ``steps`` times (a weight-tied network of that depth,
  and the warm-up of a DEQ by unrolled steps before it is trained at its fixed point);
* `run_untied`: several cells applied once each (an explicit stack).

Every application gets the same ``"dropout"`` key (for `run_untied` one key per
block), as the DEQ hands one key to every iteration of its solve, so
`deq_jax.nn.VariationalDropout` keeps one mask at every depth. The statistics mimic a
solver's (`deq_jax.SolverStats`): ``nstep`` is the depth and the residual is that of the
last step. States may be any pytree whose leaves share a leading batch axis.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020 (the
  weight-tied pre-training of a DEQ).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.solvers.base import REL_EPS, SolverStats


def row_norm(tree: Any) -> jax.Array:
    """The Euclidean norm of each sample of a batched pytree, over all its leaves: ``[B]``."""
    squares = [
        jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1)
        for x in jax.tree_util.tree_leaves(tree)
    ]
    return jnp.sqrt(sum(squares[1:], squares[0]))


def _step(module: nn.Module, variables: Any, z: Any, x: Any, key: jax.Array | None):
    """One cell application and its per-row residuals ``(z', abs [B], rel [B])``."""
    z_next = module.apply(variables, z, x, rngs=None if key is None else {"dropout": key})
    abs_res = row_norm(jax.tree_util.tree_map(jnp.subtract, z_next, z))
    return z_next, abs_res, abs_res / (row_norm(z_next) + REL_EPS)


def unroll_stats(steps: int, abs_res: jax.Array, trace: jax.Array) -> SolverStats:
    """Solver-like statistics of ``steps`` explicit steps: ``abs_res [B]`` the last
    step's residual, ``trace [B, steps]`` the relative residual of every step."""
    b = abs_res.shape[0]
    return SolverStats(
        nstep=jnp.full((b,), steps, jnp.int32),
        abs_residual=abs_res.astype(jnp.float32),
        rel_residual=trace[:, -1].astype(jnp.float32),
        converged=jnp.ones((b,), bool),
        diverged=~jnp.isfinite(abs_res),
        trace=trace.astype(jnp.float32),
    )


def run_tied(
    parent: nn.Module,
    cell: nn.Module,
    steps: int,
    x: Any,
    z: Any,
    key: jax.Array | None,
    keep: Sequence[int] = (),
) -> tuple[Any, SolverStats, list[Any]]:
    """Applies ``cell`` ``steps`` times to ``z`` with input ``x`` (a `jax.lax.scan`, so
    the cell is compiled once), every time with the ``"dropout"`` key ``key``.

    Gradients flow by plain backpropagation through every step.

    Args:
      parent: the module ``cell`` belongs to (for `is_initializing`).
      cell: the cell, ``cell(z, x) -> z``.
      steps: how many applications (>= 1).
      x: the cell's input.
      z: the initial state, a pytree of ``[B, ...]`` arrays.
      key: the ``"dropout"`` key (``None``: no dropout).
      keep: the steps (1-based) whose states are returned.

    Returns:
      ``(z, stats, states)``: the final state, solver-like statistics ``[B]`` (``trace``
      the relative step residual at each step) and the kept states.
    """
    if parent.is_initializing():
        cell(z, x)
    module, variables = cell.unbind()

    def body(z, _):
        z_next, abs_res, rel_res = _step(module, variables, z, x, key)
        return z_next, (z_next if keep else None, abs_res, rel_res)

    z, (zs, abs_res, rel_res) = jax.lax.scan(body, z, None, length=steps)
    states = [jax.tree_util.tree_map(lambda a, k=k: a[k - 1], zs) for k in keep]
    return z, unroll_stats(steps, abs_res[-1], rel_res.T), states


def run_untied(
    parent: nn.Module, cells: Sequence[nn.Module], x: Any, z: Any, key: jax.Array | None
) -> tuple[Any, SolverStats]:
    """Applies ``cells[0]``, ``cells[1]``, ... once each; block ``i`` draws its dropout
    masks from ``fold_in(key, i)``. Returns the final state and its statistics."""
    trace = []
    for i, cell in enumerate(cells):
        if parent.is_initializing():
            cell(z, x)
        module, variables = cell.unbind()
        k = None if key is None else jax.random.fold_in(key, i)
        z, abs_res, rel_res = _step(module, variables, z, x, k)
        trace.append(rel_res)
    return z, unroll_stats(len(cells), abs_res, jnp.stack(trace, axis=1))
