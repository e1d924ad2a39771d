"""The one iteration driver shared by all solvers.

`iterate(solver, fn, z0, loop=...)` runs any `Solver` on ``fn: [B, D] -> [B, D]`` with
per-sample stopping: a sample that converges (or diverges) is frozen, its ``nstep``
recorded, and the loop ends when every sample has stopped or ``max_iter`` evaluations
were spent. The lowest-residual iterate of each sample is returned. The loop itself is
chosen here and nowhere else:

* ``"while"``: `jax.lax.while_loop`, stops early; not reverse-differentiable (the
  implicit backward modes never differentiate through it).
* ``"scan"``: `jax.lax.scan` over ``max_iter - 1`` steps (later steps are skipped with
  `jax.lax.cond` once all samples stopped); reverse-differentiable, used by
  `deq_jax.backward.unrolled`.
* ``"python"``: a plain Python loop, for debugging with prints and breakpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Solver, SolverStats, residuals

LOOPS = ("while", "scan", "python")


class LoopState(NamedTuple):
    """The carry of the iteration; every array but ``k`` has the batch axis first."""

    k: jax.Array  # [] int32, evaluations of fn made so far
    z: jax.Array  # [B, D] current iterate
    fz: jax.Array  # [B, D] fn(z)
    aux: Any  # the solver's own state
    best_z: jax.Array  # [B, D] lowest-residual iterate so far
    best_abs: jax.Array  # [B]
    best_rel: jax.Array  # [B]
    nstep: jax.Array  # [B] int32
    active: jax.Array  # [B] bool, still iterating
    diverged: jax.Array  # [B] bool
    trace: jax.Array  # [B, max_iter] stop-mode residual after each evaluation


def _best_res(solver: Solver, s: LoopState) -> jax.Array:
    return s.best_rel if solver.stop_mode == "rel" else s.best_abs


def _observe(solver: Solver, s: LoopState) -> LoopState:
    """Books the residual of ``s.z`` (the ``s.k``-th evaluation) into the state."""
    abs_res, rel_res = residuals(s.z, s.fz)
    res = rel_res if solver.stop_mode == "rel" else abs_res
    finite = jnp.isfinite(abs_res) & jnp.isfinite(rel_res)
    improved = s.active & finite & (res < _best_res(solver, s))
    converged_now = s.active & finite & (res <= solver.tol)
    diverged_now = s.active & ~finite
    return s._replace(
        best_z=jnp.where(improved[:, None], s.z, s.best_z),
        best_abs=jnp.where(improved, abs_res, s.best_abs),
        best_rel=jnp.where(improved, rel_res, s.best_rel),
        nstep=jnp.where(s.active, s.k, s.nstep),
        active=s.active & ~converged_now & ~diverged_now,
        diverged=s.diverged | diverged_now,
        trace=jax.lax.dynamic_update_index_in_dim(s.trace, res, s.k - 1, axis=1),
    )


def _init(solver: Solver, fn: Callable[[jax.Array], jax.Array], z0: jax.Array) -> LoopState:
    batch = z0.shape[0]
    inf = jnp.full((batch,), jnp.inf, z0.dtype)
    s = LoopState(
        k=jnp.ones((), jnp.int32),
        z=z0,
        fz=fn(z0),
        aux=solver.init(z0),
        best_z=z0,
        best_abs=inf,
        best_rel=inf,
        nstep=jnp.zeros((batch,), jnp.int32),
        active=jnp.ones((batch,), bool),
        diverged=jnp.zeros((batch,), bool),
        trace=jnp.zeros((batch, solver.max_iter), z0.dtype),
    )
    return _observe(solver, s)


def _step(solver: Solver, fn: Callable[[jax.Array], jax.Array], s: LoopState) -> LoopState:
    z, aux = solver.propose(s.aux, s.z, s.fz, s.k)
    return _observe(solver, s._replace(k=s.k + 1, z=z, fz=fn(z), aux=aux))


def _keep_going(solver: Solver, s: LoopState) -> jax.Array:
    return (s.k < solver.max_iter) & jnp.any(s.active)


def _finish(solver: Solver, s: LoopState) -> tuple[jax.Array, SolverStats]:
    best = _best_res(solver, s)
    taken = jnp.arange(solver.max_iter)[None, :] < s.nstep[:, None]
    stats = SolverStats(
        nstep=s.nstep,
        abs_residual=s.best_abs,
        rel_residual=s.best_rel,
        converged=best <= solver.tol,
        diverged=s.diverged,
        trace=jnp.where(taken, s.trace, best[:, None]),
    )
    return s.best_z, stats


def iterate(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    z0: jax.Array,
    loop: str = "while",
) -> tuple[jax.Array, SolverStats]:
    """Runs ``solver`` on ``fn`` from ``z0 [B, D]``; returns ``(z_best [B, D], stats)``.

    Args:
      solver: any `Solver`.
      fn: the map ``[B, D] -> [B, D]``; row ``b`` of the output may depend only on row
        ``b`` of the input (samples are independent problems).
      z0: the initial iterate.
      loop: ``"while"``, ``"scan"`` or ``"python"`` (see the module docstring).
    """
    if z0.ndim != 2:
        raise ValueError(f"iterate() expects a [B, D] array, got shape {z0.shape}.")
    s = _init(solver, fn, z0)
    if loop == "while":
        s = jax.lax.while_loop(lambda s: _keep_going(solver, s), lambda s: _step(solver, fn, s), s)
    elif loop == "scan":

        def scan_body(s, _):
            s = jax.lax.cond(_keep_going(solver, s), lambda s: _step(solver, fn, s), lambda s: s, s)
            return s, None

        s, _ = jax.lax.scan(scan_body, s, None, length=solver.max_iter - 1)
    elif loop == "python":
        while bool(_keep_going(solver, s)):
            s = _step(solver, fn, s)
    else:
        raise ValueError(f"Unknown loop {loop!r}. Valid loops: {', '.join(LOOPS)}.")
    return _finish(solver, s)
