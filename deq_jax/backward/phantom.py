"""Inexact gradients: phantom gradients and the Jacobian-free backward.

Both solve the forward problem without tracking gradients, then differentiate a few
cheap steps taken from the fixed point. The returned value is exactly the solver's
``z*``; only its gradient is the approximation.

References:
  Geng et al., "On Training Implicit Models", NeurIPS 2021 (phantom gradients).
  Fung et al., "JFB: Jacobian-Free Backpropagation for Implicit Networks", AAAI 2022.
"""

from __future__ import annotations

import dataclasses

import jax

from deq_jax.backward.base import Backward
from deq_jax.solvers.loop import iterate


def phantom_steps(fn, z_star, params, k: int, tau: float):
    """``k`` damped steps ``z <- z + tau (fn(z, params) - z)`` from ``z*`` (differentiable).

    A Python loop, not a ``lax.scan``: ``k`` is small, and XLA's CPU backend runs the
    weight gradient of a convolution inside a loop body on a generic kernel, about 10x
    slower than outside one (jax-ml/jax#12868); the prefix-sum and maze train steps
    cost 1.7x less unrolled (BUILD_NOTES "Solvers and gradients", `benchmarks.branch_cost`).
    """
    z = z_star
    for _ in range(k):
        z = z + tau * (fn(z, params) - z)
    return z


def _solve_then_steps(fn, z0, params, solver, k, tau):
    frozen = jax.lax.stop_gradient(params)
    z_star, stats = iterate(solver, lambda z: fn(z, frozen), z0)
    z_star = jax.lax.stop_gradient(z_star)
    z_k = phantom_steps(fn, z_star, params, k, tau)
    return z_star + (z_k - jax.lax.stop_gradient(z_k)), stats


@dataclasses.dataclass(frozen=True, kw_only=True)
class phantom(Backward):  # noqa: N801 - registry name is the constructor name
    """Phantom gradient: backprop through ``k`` damped steps from ``z*``.

    As ``k`` grows (for a contractive ``f``) the gradient tends to the exact implicit one.

    Attributes:
      k: unrolled steps (>= 1).
      tau: damping of each step, in ``(0, 1]``.
    """

    k: int = 5
    tau: float = 1.0

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}.")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau!r}.")

    def solve(self, fn, z0, params, solver, probe=None):
        return _solve_then_steps(fn, z0, params, solver, self.k, self.tau)


@dataclasses.dataclass(frozen=True, kw_only=True)
class jacobian_free(Backward):  # noqa: N801 - registry name is the constructor name
    """Jacobian-free backprop: the inverse ``(I - J)^-1`` replaced by the identity.

    The gradient is that of one step ``f(z*, args)`` with ``z*`` held constant.
    """

    def solve(self, fn, z0, params, solver, probe=None):
        return _solve_then_steps(fn, z0, params, solver, 1, 1.0)
