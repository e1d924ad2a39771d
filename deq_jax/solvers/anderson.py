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


class AndersonState(NamedTuple):
    """Ring buffers of the last ``m`` iterates and their images."""

    xs: jax.Array  # [B, m, D] past iterates z_i
    fs: jax.Array  # [B, m, D] past images f(z_i)


def anderson_weights(gs: jax.Array, valid: jax.Array, lam: float) -> jax.Array:
    """Mixing weights ``alpha [B, m]`` minimising ``||sum_i alpha_i g_i||`` with sum 1.

    Solves ``(G G^T + r I) y = 1`` over the valid slots and returns ``y / sum(y)``, the
    closed form of the constrained least-squares problem. The ridge ``r = lam *
    mean_i ||g_i||^2`` scales with the residuals, so the method behaves the same for
    states of any magnitude and keeps working near convergence.

    Args:
      gs: residuals ``g_i = f(z_i) - z_i``, ``[B, m, D]``.
      valid: which of the ``m`` slots hold history, ``[m]`` bool.
      lam: relative ridge regularisation.

    Returns:
      ``[B, m]`` weights summing to one, zero on invalid slots.
    """
    m = gs.shape[1]
    both = valid[:, None] & valid[None, :]
    gram = jnp.where(both, jnp.einsum("bid,bjd->bij", gs, gs), 0.0)  # [B, m, m]
    diag = jnp.diagonal(gram, axis1=1, axis2=2)  # [B, m]
    n_valid = jnp.maximum(jnp.sum(valid), 1)
    tiny = jnp.sqrt(jnp.finfo(gs.dtype).tiny)
    ridge = lam * jnp.sum(diag, axis=1) / n_valid + tiny  # [B]
    eye = jnp.eye(m, dtype=gs.dtype)
    h = gram + eye * jnp.where(valid, ridge[:, None], 1.0)[:, None, :]
    rhs = jnp.broadcast_to(valid.astype(gs.dtype), (gs.shape[0], m))
    y = jnp.linalg.solve(h, rhs[..., None])[..., 0]
    return y / jnp.sum(y, axis=1, keepdims=True)


def anderson_step(
    xs: jax.Array, fs: jax.Array, alpha: jax.Array, beta: float
) -> jax.Array:
    """``beta * sum_i alpha_i f(z_i) + (1 - beta) * sum_i alpha_i z_i``, ``[B, D]``."""
    mixed_f = jnp.einsum("bm,bmd->bd", alpha, fs)
    if beta == 1.0:
        return mixed_f
    return beta * mixed_f + (1.0 - beta) * jnp.einsum("bm,bmd->bd", alpha, xs)


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
        return AndersonState(xs=zeros, fs=zeros)

    def propose(self, aux, z, fz, k):
        slot = (k - 1) % self.m
        xs = jax.lax.dynamic_update_index_in_dim(aux.xs, z, slot, axis=1)
        fs = jax.lax.dynamic_update_index_in_dim(aux.fs, fz, slot, axis=1)
        valid = jnp.arange(self.m) < jnp.minimum(k, self.m)
        alpha = anderson_weights(fs - xs, valid, self.lam)
        return anderson_step(xs, fs, alpha, self.beta), AndersonState(xs, fs)
