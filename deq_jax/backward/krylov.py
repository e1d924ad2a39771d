"""GMRES for the implicit backward system, through `jax.scipy.sparse.linalg.gmres`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import SolverStats

# The true residual may exceed GMRES' own (Givens-rotation) estimate by round-off; a
# solve is flagged as failed only beyond this multiple of the requested tolerance.
_GMRES_SLACK = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class gmres:  # noqa: N801 - registry-style name
    """Restarted GMRES for ``(I - J^T) u = g``, over the whole batch at once.

    Attributes:
      tol: relative tolerance ``||r|| <= tol * ||g||``.
      max_iter: the most restart cycles.
      restart: Krylov subspace size per cycle.
    """

    tol: float = 1e-6
    max_iter: int = 20
    restart: int = 20

    def __post_init__(self):
        if not self.tol > 0:
            raise ValueError(f"tol must be positive, got {self.tol!r}.")
        if self.max_iter < 1 or self.restart < 1:
            raise ValueError("max_iter and restart must be >= 1.")

    def solve_linear(
        self, vjp_z: Callable[[jax.Array], jax.Array], g: jax.Array
    ) -> tuple[jax.Array, SolverStats]:
        """Solves ``u = vjp_z(u) + g`` for ``u [B, D]``; stats describe the true residual."""
        matvec = lambda u: u - vjp_z(u)
        u, _ = jax.scipy.sparse.linalg.gmres(
            matvec,
            g,
            tol=self.tol,
            atol=0.0,
            restart=self.restart,
            maxiter=self.max_iter,
            solve_method="batched",
        )
        r_abs = jnp.linalg.norm(matvec(u) - g, axis=-1)
        r_rel = r_abs / (jnp.linalg.norm(g, axis=-1) + 1e-8)
        total_ok = jnp.linalg.norm(r_abs) <= _GMRES_SLACK * self.tol * jnp.linalg.norm(g)
        finite = jnp.isfinite(r_abs)
        batch = g.shape[0]
        stats = SolverStats(
            nstep=jnp.full((batch,), self.max_iter * self.restart, jnp.int32),
            abs_residual=r_abs,
            rel_residual=r_rel,
            converged=finite & total_ok,
            diverged=~finite,
            trace=r_rel[:, None],
        )
        return u, stats
