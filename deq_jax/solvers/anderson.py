"""Anderson acceleration (type II, with damping and a scale-free ridge).

References:
  Anderson, "Iterative procedures for nonlinear integral equations", J. ACM 1965.
  Walker & Ni, "Anderson acceleration for fixed-point iterations", SIAM J. Numer.
  Anal. 2011.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Solver
from deq_jax.solvers.linalg import spd_solve


class AndersonState(NamedTuple):
    """Ring buffers of the last ``m`` images and residuals, and their Gram matrix."""

    fs: jax.Array  # [B, m, D] past images f(z_i)
    gs: jax.Array  # [B, m, D] past residuals g_i = f(z_i) - z_i
    gram: jax.Array  # [B, m, m] <g_i, g_j>, updated one row per step


def update_gram(gram: jax.Array, gs: jax.Array, g: jax.Array, slot: jax.Array) -> jax.Array:
    """The Gram matrix ``[B, m, m]`` once residual ``g [B, D]`` is in ring slot ``slot`` of ``gs``.

    Only row and column ``slot`` change: ``m D`` work per step instead of ``m^2 D``.
    """
    row = jnp.einsum("bmd,bd->bm", gs, g)  # [B, m]
    gram = jax.lax.dynamic_update_index_in_dim(gram, row, slot, axis=1)
    return jax.lax.dynamic_update_index_in_dim(gram, row, slot, axis=2)


def anderson_weights(gram: jax.Array, valid: jax.Array, lam: float) -> jax.Array:
    """Mixing weights ``alpha [B, m]`` minimising ``||sum_i alpha_i g_i||`` with sum 1.

    Solves ``(G G^T + r I) y = 1`` over the valid slots and returns ``y / sum(y)``, the
    closed form of the constrained least-squares problem. The ridge ``r = lam *
    mean_i ||g_i||^2`` scales with the residuals, so the method behaves the same for
    states of any magnitude and keeps working near convergence.

    Args:
      gram: the Gram matrix ``<g_i, g_j>`` of the residuals in memory, ``[B, m, m]``.
      valid: which of the ``m`` slots hold history, ``[m]`` bool.
      lam: relative ridge regularisation.

    Returns:
      ``[B, m]`` weights summing to one, zero on invalid slots.
    """
    m = gram.shape[-1]
    gram = jnp.where(valid[:, None] & valid[None, :], gram, 0.0)
    diag = jnp.diagonal(gram, axis1=1, axis2=2)  # [B, m]
    n_valid = jnp.maximum(jnp.sum(valid), 1)
    tiny = jnp.sqrt(jnp.finfo(gram.dtype).tiny)
    ridge = lam * jnp.sum(diag, axis=1) / n_valid + tiny  # [B]
    eye = jnp.eye(m, dtype=gram.dtype)
    h = gram + eye * jnp.where(valid, ridge[:, None], 1.0)[:, None, :]
    rhs = jnp.broadcast_to(valid.astype(gram.dtype), (gram.shape[0], m))
    y = spd_solve(h, rhs)
    return y / jnp.sum(y, axis=1, keepdims=True)


def anderson_step(
    fs: jax.Array, gs: jax.Array, alpha: jax.Array, beta: float | jax.Array
) -> jax.Array:
    """``beta * sum_i alpha_i f(z_i) + (1 - beta) * sum_i alpha_i z_i``, ``[B, D]``.

    With ``z_i = f(z_i) - g_i`` this is ``sum_i alpha_i f(z_i) - (1 - beta) sum_i alpha_i g_i``.

    Args:
      fs: images ``[B, m, D]``.
      gs: residuals ``[B, m, D]``.
      alpha: weights ``[B, m]``.
      beta: damping, a number or one per sample ``[B]``. A Python ``1`` takes
        ``sum_i alpha_i f(z_i)`` without reading ``gs``.
    """
    mixed_f = jnp.einsum("bm,bmd->bd", alpha, fs)
    if isinstance(beta, int | float) and beta == 1.0:
        return mixed_f
    beta = jnp.reshape(jnp.asarray(beta, mixed_f.dtype), (-1, 1))
    return mixed_f - (1.0 - beta) * jnp.einsum("bm,bmd->bd", alpha, gs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class anderson(Solver):  # noqa: N801 - registry name is the constructor name
    """Anderson acceleration with memory ``m``.

    Attributes:
      m: how many past iterates are mixed (the history size).
      beta: damping of the mixed step; ``1`` takes the mixed image ``sum alpha f(z)``.
      lam: ridge regularisation of the least-squares problem, relative to the mean
        squared residual in memory.
      tol, max_iter, stop_mode: see `Solver`.
    """

    m: int = 5
    beta: float = 1.0
    lam: float = 1e-4

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.m, int) or self.m < 1:
            raise ValueError(f"m must be an integer >= 1, got {self.m!r}.")
        if not 0 < self.beta <= 1:
            raise ValueError(f"beta must lie in (0, 1], got {self.beta!r}.")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam!r}.")

    def init(self, z0):
        b, d = z0.shape
        zeros = jnp.zeros((b, self.m, d), z0.dtype)
        return AndersonState(fs=zeros, gs=zeros, gram=jnp.zeros((b, self.m, self.m), z0.dtype))

    def propose(self, aux, z, fz, k):
        slot = (k - 1) % self.m
        g = fz - z
        fs = jax.lax.dynamic_update_index_in_dim(aux.fs, fz, slot, axis=1)
        gs = jax.lax.dynamic_update_index_in_dim(aux.gs, g, slot, axis=1)
        gram = update_gram(aux.gram, gs, g, slot)
        valid = jnp.arange(self.m) < jnp.minimum(k, self.m)
        alpha = anderson_weights(gram, valid, self.lam)
        return anderson_step(fs, gs, alpha, self.beta), AndersonState(fs, gs, gram)
