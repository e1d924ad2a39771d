"""The solver loop's fixed cost on an easy problem, against jaxopt, interleaved.

On the tanh cell of `benchmarks.solver_problems` (``easy``: spectral norm 0.9; width
256, batch 64) deq_jax stops each sample at a relative tolerance (``rel_tol``, default
1e-4) and returns each sample's lowest-residual iterate; jaxopt's
``FixedPointIteration`` and ``AndersonAcceleration`` (history 5) solve the whole batch
as one vector and stop on its norm, with their tolerance set so that every sample
reaches ``rel_tol`` (``rel_tol * min_b ||z*_b||``, the batch norm bounding each
sample's). Each round times every solve once, in turn (``rounds`` rounds after a
compiling call); the medians and their ratios are reported, with the f-evaluations each
made. A second measurement runs deq_jax's fixed-point iteration for ``fixed_steps``
evaluations (a tolerance nothing reaches) against a plain ``lax.fori_loop`` of the same
cell: the loop's bookkeeping per step (stopping test, best iterate, statistics), in
microseconds. Run through ``python -m benchmarks.solvers --loop_cost`` (one JSON line
per measurement).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jaxopt

import deq_jax as dj
from benchmarks.solver_problems import cell, make_problem


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds of each ``fn()``, the functions timed in turn each round."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _solves(w, inj, rel_tol: float, max_iter: int) -> dict[str, tuple[Callable, Callable]]:
    """``name -> (solve, evaluations)`` for deq_jax's and jaxopt's solvers."""
    reference = dj.fixed_point(
        cell, jnp.zeros_like(inj), (w, inj), solver=dj.solvers.anderson(tol=1e-7, max_iter=2000)
    ).value
    tol_abs = rel_tol * float(jnp.min(jnp.linalg.norm(reference, axis=1)))
    batch_fp = lambda z, w, inj: cell(z, (w, inj))
    out = {}
    for name in ("fixed_point_iteration", "anderson"):
        solver = dj.solvers.get(name, tol=rel_tol, max_iter=max_iter)
        run = jax.jit(
            lambda w, inj, s=solver: dj.fixed_point(cell, jnp.zeros_like(inj), (w, inj), solver=s)
        )
        out[name] = (
            lambda run=run: run(w, inj),
            lambda run=run: int(run(w, inj).stats.nstep.max()),
        )
    jaxopt_solvers = {
        "jaxopt_fixed_point_iteration": jaxopt.FixedPointIteration(
            fixed_point_fun=batch_fp, maxiter=max_iter, tol=tol_abs
        ),
        "jaxopt_anderson": jaxopt.AndersonAcceleration(
            fixed_point_fun=batch_fp, history_size=5, maxiter=max_iter, tol=tol_abs
        ),
    }
    for name, solver in jaxopt_solvers.items():
        run = jax.jit(lambda w, inj, s=solver: s.run(jnp.zeros_like(inj), w, inj))
        out[name] = (
            lambda run=run: run(w, inj),
            lambda run=run: int(run(w, inj).state.num_fun_eval),
        )
    return out


def loop_cost(
    width: int = 256,
    batch: int = 64,
    rel_tol: float = 1e-4,
    rounds: int = 41,
    max_iter: int = 500,
    fixed_steps: int = 40,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The measurements of the module docstring, one dict per row."""
    w, inj = make_problem("easy", width, batch, seed)
    solves = _solves(w, inj, rel_tol, max_iter)
    medians = _interleaved({name: solve for name, (solve, _) in solves.items()}, rounds)
    rows = []
    for name, (_, evaluations) in solves.items():
        peer = "jaxopt_" + name if not name.startswith("jaxopt") else None
        rows.append(
            dict(
                measurement="solve",
                solver=name,
                width=width,
                batch=batch,
                rel_tol=rel_tol,
                ms=1e3 * medians[name],
                f_evaluations=evaluations(),
                ratio_to_jaxopt=None if peer is None else medians[name] / medians[peer],
                rounds=rounds,
            )
        )
    never = dj.solvers.fixed_point_iteration(tol=1e-30, max_iter=fixed_steps)
    ours = jax.jit(lambda w, inj: dj.fixed_point(cell, jnp.zeros_like(inj), (w, inj), solver=never))
    step = lambda i, z: cell(z, (w, inj))
    plain = jax.jit(lambda w, inj: jax.lax.fori_loop(0, fixed_steps, step, jnp.zeros_like(inj)))
    fixed = _interleaved(dict(ours=lambda: ours(w, inj), plain=lambda: plain(w, inj)), rounds)
    rows.append(
        dict(
            measurement="per_step",
            steps=fixed_steps,
            ours_us_per_step=1e6 * fixed["ours"] / fixed_steps,
            plain_loop_us_per_step=1e6 * fixed["plain"] / fixed_steps,
            bookkeeping_us_per_step=1e6 * (fixed["ours"] - fixed["plain"]) / fixed_steps,
            rounds=rounds,
        )
    )
    return rows
