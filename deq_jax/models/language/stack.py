"""The explicit modes of `DEQTransformerLM`: cells applied a fixed number of times.

``weight_tied`` applies one cell ``n_layer`` times, ``unrolled`` (in training) applies
it ``unroll_steps`` times and keeps some intermediate states for the fixed-point
correction loss, ``untied`` applies ``n_layer`` cells once each. Every application gets
the same ``"dropout"`` key (for ``untied`` one key per block), as the DEQ hands one key
to every iteration of its solve, so a weight-tied stack sees one dropout mask at every
depth, as in locuslab/deq's pre-training. The statistics mimic a solver's: ``nstep`` is
the depth and the residual is that of the last step. A weight-tied stack is a
`jax.lax.scan`, so the cell is compiled once whatever the depth.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the
  fixed-point correction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.solvers.base import REL_EPS, SolverStats


def correction_steps(steps: int, states: int) -> tuple[int, ...]:
    """The steps (1-based) whose states enter the correction loss: ``states`` of them,
    evenly spaced, the last one ``steps``; e.g. ``(3, 6)`` for 6 steps and 2 states."""
    states = min(states, steps)
    return tuple(math.ceil((s + 1) * steps / states) for s in range(states))


def correction_weights(states: int, gamma: float) -> tuple[float, ...]:
    """``gamma ** (states - 1 - s)`` for ``s = 0, ..., states - 1`` (the last weighs 1)."""
    return tuple(gamma ** (states - 1 - s) for s in range(states))


def _row_norm(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1))  # [B]


def _step(module: nn.Module, variables: Any, z: jax.Array, x: Any, key: jax.Array | None):
    """One cell application and its per-row residuals ``(z', abs, rel)``."""
    z_next = module.apply(variables, z, x, rngs=None if key is None else {"dropout": key})
    abs_res = _row_norm(z_next - z)
    return z_next, abs_res, abs_res / (_row_norm(z_next) + REL_EPS)


def _stats(steps: int, abs_res: jax.Array, trace: jax.Array) -> SolverStats:
    """Solver-like statistics of ``steps`` explicit steps; ``trace [B, steps]``."""
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
    z: jax.Array,
    key: jax.Array | None,
    keep: Sequence[int] = (),
) -> tuple[jax.Array, SolverStats, list[jax.Array]]:
    """Applies ``cell`` ``steps`` times to ``z`` with input ``x`` (a `jax.lax.scan`, so
    the cell is compiled once), every time with the ``"dropout"`` key ``key``.

    Args:
      parent: the module ``cell`` belongs to (for `is_initializing`).
      cell: the cell.
      steps: how many applications.
      x: the cell's input.
      z: the initial state ``[B, ...]``.
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
    states = [zs[k - 1] for k in keep]
    return z, _stats(steps, abs_res[-1], rel_res.T), states


def run_untied(
    parent: nn.Module, cells: Sequence[nn.Module], x: Any, z: jax.Array, key: jax.Array | None
) -> tuple[jax.Array, SolverStats]:
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
    return z, _stats(len(cells), abs_res, jnp.stack(trace, axis=1))
