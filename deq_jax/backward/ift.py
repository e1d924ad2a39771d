"""Implicit-function-theorem gradients with `jax.custom_vjp`.

At a fixed point ``z* = f(z*, a)``, ``dz*/da = (I - J)^-1 df/da`` with ``J = df/dz``.
The vector-Jacobian product is ``u^T df/da`` where ``u = u J + g`` (``g`` the incoming
cotangent): a linear fixed-point problem solved by any forward solver or by GMRES.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Blondel et al., "Efficient and Modular Implicit Differentiation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.backward.base import Backward, FlatFn
from deq_jax.backward.krylov import gmres
from deq_jax.backward.nonfinite import all_finite
from deq_jax.backward.probe import encode_stats
from deq_jax.solvers import get as get_solver
from deq_jax.solvers.base import REL_EPS, Solver, SolverStats
from deq_jax.solvers.loop import iterate

ON_FAILURE = ("warn", "nan", "ignore")


class BackwardSolveWarning(RuntimeWarning):
    """The implicit backward linear system did not reach its tolerance."""


def _warn_not_converged(converged, abs_residual, nstep, grads_finite):
    bad = ~np.asarray(converged)
    # under vmap the guarding cond runs both branches; NaN gradients are reported by
    # `deq_jax.backward.nonfinite`, not called inaccurate here
    if not bad.any() or not np.all(grads_finite):
        return
    warnings.warn(
        f"IFT backward solve did not converge for {int(bad.sum())} of {bad.size} samples "
        f"(worst residual {float(np.max(np.asarray(abs_residual)[bad])):.3e} after "
        f"{int(np.max(np.asarray(nstep)))} steps); gradients may be inaccurate. Raise the "
        "backward solver's max_iter, or make f more contractive.",
        BackwardSolveWarning,
        stacklevel=2,
    )


def _report_failure(stats: SolverStats, grads: Any, on_failure: str) -> Any:
    ok = jnp.all(stats.converged)
    if on_failure == "warn":
        finite = all_finite(grads)
        jax.lax.cond(
            ok | ~finite,
            lambda: None,
            lambda: jax.debug.callback(
                _warn_not_converged, stats.converged, stats.abs_residual, stats.nstep, finite
            ),
        )
    elif on_failure == "nan":
        nan_if_bad = lambda x: (
            jnp.where(ok, x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.inexact) else x
        )
        grads = jax.tree_util.tree_map(nan_if_bad, grads)
    return grads


@dataclasses.dataclass(frozen=True, kw_only=True)
class ift(Backward):  # noqa: N801 - registry name is the constructor name
    """Implicit differentiation: solve ``u = u J_f(z*) + g``, return ``u^T df/dargs``.

    Attributes:
      solver: the solver of the backward linear system: a `Solver` (any registered
        forward solver), a registered solver name, ``"gmres"`` or a `gmres` instance.
        ``None`` reuses the forward solver (with the forward call's budget), changed by
        ``tol`` and ``max_iter`` where they are given.
      tol: the backward tolerance of an inherited forward solver (``None``: the
        forward ``tol``). Give an explicit ``solver`` its own ``tol`` instead.
      max_iter: the backward budget of an inherited forward solver (``None``: the
        forward call's budget).
      on_failure: what happens when the backward solve misses its tolerance:
        ``"warn"`` emits a `BackwardSolveWarning` from inside the compiled program (no
        cost when it converges; NaN gradients are reported instead by the
        `deq_jax.backward.NonFiniteGradientWarning` every mode emits), ``"nan"`` turns
        every gradient into NaN so a training loop skips the step (and that warning
        says so), ``"ignore"`` does neither.
    """

    solver: Any = None
    tol: float | None = None
    max_iter: int | None = None
    on_failure: str = "warn"

    def __post_init__(self):
        if self.on_failure not in ON_FAILURE:
            raise ValueError(
                f"on_failure must be one of {', '.join(ON_FAILURE)}, got {self.on_failure!r}."
            )
        if self.solver is not None and (self.tol is not None or self.max_iter is not None):
            raise ValueError(
                "ift(tol=, max_iter=) change the inherited forward solver; give an explicit "
                "ift(solver=...) its own tol and max_iter instead."
            )
        if isinstance(self.solver, str):
            built = gmres() if self.solver == "gmres" else get_solver(self.solver)
            object.__setattr__(self, "solver", built)
        elif self.solver is not None and not isinstance(self.solver, (Solver, gmres)):
            raise ValueError(
                f"ift(solver=...) takes a Solver, a solver name or 'gmres'; got {self.solver!r}."
            )

    def with_floor(self, floor: Any) -> ift:
        """An explicit backward solver given ``floor`` (an inherited forward solver
        carries the forward solver's floor already; GMRES stops on its own tolerance)."""
        if floor is None or not isinstance(self.solver, Solver) or self.solver.floor:
            return self
        return dataclasses.replace(self, solver=self.solver.replace(floor=floor))

    def inherit(self, forward_solver: Solver) -> Solver:
        """The backward solver inherited from ``forward_solver`` (``solver`` unset)."""
        changes = {k: v for k, v in (("tol", self.tol), ("max_iter", self.max_iter)) if v}
        return forward_solver.replace(**changes) if changes else forward_solver

    def solve(self, fn: FlatFn, z0, params, solver, probe=None):
        return _ift_solve(self, fn, solver, z0, params, probe)

    def backward_solve(
        self, fn: FlatFn, z_star, params, g, forward_solver: Solver, floor: Any = None
    ):
        """Solves the backward system; returns ``(param cotangents, stats)``.

        ``floor`` is the forward solve's relative residual floor ``[B]`` (a
        reduced-precision cell, `deq_jax.solvers.floor`), or ``None``: the backward
        solve runs the same arithmetic, so it stops at the same relative floor without
        measuring its own (in ``"abs"`` stop mode, scaled by ``||g||``).
        """
        # one evaluation at z* linearises f in both z and params (XLA drops the unused
        # params cotangent from the loop's body)
        _, vjp_f = jax.vjp(fn, z_star, params)
        vjp_z1 = lambda u: vjp_f(u)[0]
        linear_solver = self.solver if self.solver is not None else self.inherit(forward_solver)
        if isinstance(linear_solver, gmres):
            u, stats = linear_solver.solve_linear(vjp_z1, g)
        else:
            if floor is not None and linear_solver.stop_mode == "abs":
                floor = floor * jnp.linalg.norm(g, axis=-1)
            system = lambda u: vjp_z1(u) + g
            u, stats = iterate(linear_solver, system, jnp.zeros_like(g), floor=floor)
        _, grads = vjp_f(u)
        return _report_failure(stats, grads, self.on_failure), stats


def relative_floor(solver: Solver, stats: SolverStats, z_star: jax.Array) -> jax.Array | None:
    """The forward solve's residual floor relative to ``||z*||`` (``None`` unmeasured)."""
    if stats.floor is None or solver.stop_mode == "rel":
        return stats.floor
    return stats.floor / (jnp.linalg.norm(z_star, axis=-1) + REL_EPS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _ift_solve(mode: ift, fn: FlatFn, solver: Solver, z0, params, probe):
    return iterate(solver, lambda z: fn(z, params), z0)


def _ift_fwd(mode, fn, solver, z0, params, probe):
    z_star, stats = iterate(solver, lambda z: fn(z, params), z0)
    return (z_star, stats), (z_star, params, probe, relative_floor(solver, stats, z_star))


def _ift_bwd(mode, fn, solver, residuals, cotangents):
    z_star, params, probe, floor = residuals
    g = cotangents[0]
    grads, stats = mode.backward_solve(fn, z_star, params, g, solver, floor)
    probe_ct = None if probe is None else encode_stats(stats, probe.dtype)
    return jnp.zeros_like(z_star), grads, probe_ct


_ift_solve.defvjp(_ift_fwd, _ift_bwd)
