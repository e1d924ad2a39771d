"""Regularisers that stabilise equilibrium models, and diagnostics of their stability.

* `jacobian_frobenius`: Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` (a loss term).
* `spectral_radius`: power-method estimate of ``rho(J_f(z*))`` (a diagnostic).
* `spectral_radius_penalty_estimate`: a shorter power method whose last steps are
  differentiable, for a penalty on ``rho``.
* `unrolled_trajectory`, `fixed_point_correction`, `trajectory_weights`,
  `step_penalty`: losses along the path of the solver.
* Penalty terms handed to a DEQ (`deq_jax.nn.DEQSpec.terms`), each sowing per-sample
  values at the fixed point that the train step weighs: `JacobianTerm`,
  `SpectralHinge`, `Alignment`, and the diagnostic `SpectralRadius` (`Term` is their
  base).

Example::

    sol = dj.fixed_point(f, z0, (params, x), solver=..., backward=...)
    jac = dj.regularizers.jacobian_frobenius(f, sol.value, (params, x), key)  # [B]
    loss = task_loss + gamma * jac.mean()

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Bai, Geng, Savani, Kolter, "Deep Equilibrium Optical Flow Estimation", CVPR 2022.
"""

from deq_jax.regularizers.jacobian import (
    PROBES,
    jacobian_frobenius,
    spectral_radius,
    spectral_radius_penalty_estimate,
)
from deq_jax.regularizers.terms import (
    Alignment,
    JacobianTerm,
    SpectralHinge,
    SpectralRadius,
    Term,
    evaluate_terms,
)
from deq_jax.regularizers.trajectory import (
    WEIGHTS,
    fixed_point_correction,
    step_penalty,
    trajectory_weights,
    unrolled_trajectory,
)

__all__ = [
    "Alignment",
    "JacobianTerm",
    "SpectralHinge",
    "SpectralRadius",
    "Term",
    "evaluate_terms",
    "PROBES",
    "WEIGHTS",
    "fixed_point_correction",
    "jacobian_frobenius",
    "spectral_radius",
    "spectral_radius_penalty_estimate",
    "step_penalty",
    "trajectory_weights",
    "unrolled_trajectory",
]
