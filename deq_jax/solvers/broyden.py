"""Limited-memory "good" Broyden's method for ``g(z) = f(z) - z = 0``.

The inverse Jacobian of ``g`` is approximated by ``-I + sum_i u_i v_i^T`` with at most
``memory`` rank-one terms kept in a ring buffer, so memory is O(memory x state).

References:
  Broyden, "A class of methods for solving nonlinear simultaneous equations",
  Math. Comp. 1965.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019 (the DEQ variant).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Solver


class BroydenState(NamedTuple):
    """The low-rank inverse-Jacobian terms and the previous iterate."""

    us: jax.Array  # [B, memory, D]
    vs: jax.Array  # [B, memory, D]
    prev_z: jax.Array  # [B, D]
    prev_g: jax.Array  # [B, D]


def inv_jacobian_matvec(us: jax.Array, vs: jax.Array, x: jax.Array) -> jax.Array:
    """``(-I + U V^T) x`` for ``x [B, D]``."""
    return -x + jnp.einsum("bmd,bm->bd", us, jnp.einsum("bmd,bd->bm", vs, x))


def inv_jacobian_rmatvec(us: jax.Array, vs: jax.Array, x: jax.Array) -> jax.Array:
    """``x^T (-I + U V^T)`` for ``x [B, D]``."""
    return -x + jnp.einsum("bmd,bm->bd", vs, jnp.einsum("bmd,bd->bm", us, x))


def broyden_update(
    us: jax.Array, vs: jax.Array, dz: jax.Array, dg: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The good-Broyden rank-one term ``(u, v)`` for steps ``dz``, ``dg`` (each ``[B, D]``).

    ``v^T = dz^T H`` and ``u = (dz - H dg) / (v^T dg)`` with ``H`` the current inverse
    Jacobian estimate; samples whose denominator vanishes (e.g. converged ones) get a
    zero term instead of NaN.
    """
    v = inv_jacobian_rmatvec(us, vs, dz)
    denom = jnp.sum(v * dg, axis=-1, keepdims=True)
    ok = jnp.abs(denom) > jnp.finfo(dz.dtype).tiny
    u = jnp.where(ok, (dz - inv_jacobian_matvec(us, vs, dg)) / jnp.where(ok, denom, 1.0), 0.0)
    return u, jnp.where(ok, v, 0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class broyden(Solver):  # noqa: N801 - registry name is the constructor name
    """Limited-memory good Broyden's method.

    Attributes:
      memory: rank-one terms kept (the oldest is overwritten once full).
      tol, max_iter, stop_mode: see `Solver`.
    """

    memory: int = 20

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.memory, int) or self.memory < 1:
            raise ValueError(f"memory must be an integer >= 1, got {self.memory!r}.")

    def init(self, z0):
        b, d = z0.shape
        zeros = jnp.zeros((b, self.memory, d), z0.dtype)
        return BroydenState(us=zeros, vs=zeros, prev_z=z0, prev_g=jnp.zeros_like(z0))

    def propose(self, aux, z, fz, k):
        g = fz - z
        u, v = broyden_update(aux.us, aux.vs, z - aux.prev_z, g - aux.prev_g)
        # On the first call dz = 0, so (u, v) = 0 and the buffers are unchanged.
        slot = (k - 2) % self.memory
        us = jax.lax.dynamic_update_index_in_dim(aux.us, u, slot, axis=1)
        vs = jax.lax.dynamic_update_index_in_dim(aux.vs, v, slot, axis=1)
        z_next = z - inv_jacobian_matvec(us, vs, g)
        return z_next, BroydenState(us=us, vs=vs, prev_z=z, prev_g=g)
