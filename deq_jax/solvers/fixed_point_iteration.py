"""Damped fixed-point (Picard / Krasnosel'skii-Mann) iteration."""

from __future__ import annotations

import dataclasses

import jax

from deq_jax.solvers.base import Solver


def damped_step(z: jax.Array, fz: jax.Array, tau: float) -> jax.Array:
    """``(1 - tau) z + tau f(z)``: the Krasnosel'skii-Mann step; at a Python ``1.0``
    exactly ``f(z)`` (plain iteration, without the rounding of ``z + (f(z) - z)``)."""
    if isinstance(tau, (int, float)) and tau == 1:
        return fz
    return z + tau * (fz - z)


@dataclasses.dataclass(frozen=True, kw_only=True)
class fixed_point_iteration(Solver):  # noqa: N801 - registry name is the constructor name
    """Damped fixed-point iteration ``z <- (1 - tau) z + tau f(z)``.

    Attributes:
      tau: the damping in ``(0, 1]``; ``1`` is plain iteration ``z <- f(z)``.
      tol, max_iter, stop_mode: see `Solver`.
    """

    tau: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau!r}.")

    def init(self, z0):
        return ()

    def propose(self, aux, z, fz, k):
        return damped_step(z, fz, self.tau), aux
