"""Small dense linear algebra for solver kernels, written for many tiny systems.

XLA's CPU backend solves a batch of 5x5 systems through one LAPACK call per matrix,
which costs as much as a DEQ cell evaluation. Anderson's systems are small (``m`` is
the history size), so a Cholesky factorisation written out over ``m`` and vectorised
over the batch is some 20x faster and fuses into a handful of kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def spd_solve(h: jax.Array, rhs: jax.Array) -> jax.Array:
    """Solves ``h x = rhs`` for symmetric positive-definite ``h``, batched.

    Args:
      h: ``[B, n, n]`` SPD matrices (``n`` small; the factorisation is unrolled).
      rhs: ``[B, n]`` right-hand sides.

    Returns:
      ``[B, n]`` solutions.
    """
    n = h.shape[-1]
    rows = jnp.arange(n)
    cols = []  # columns of the lower Cholesky factor L, each [B, n]
    for j in range(n):
        c = h[:, :, j]
        for k in range(j):
            c = c - cols[k] * cols[k][:, j : j + 1]
        c = jnp.where(rows >= j, c / jnp.sqrt(c[:, j : j + 1]), 0.0)
        cols.append(c)
    y = []  # L y = rhs
    for i in range(n):
        s = rhs[:, i]
        for k in range(i):
            s = s - cols[k][:, i] * y[k]
        y.append(s / cols[i][:, i])
    x = [None] * n  # L^T x = y
    for i in reversed(range(n)):
        s = y[i]
        for k in range(i + 1, n):
            s = s - cols[i][:, k] * x[k]
        x[i] = s / cols[i][:, i]
    return jnp.stack(x, axis=1)
