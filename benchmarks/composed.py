r"""Benchmarks composed solvers against their parts on the tanh cell (issue 38).

``sequence((fixed_point_iteration, 3), anderson)`` and ``fallback(anderson, broyden)``
against fixed-point iteration, Anderson and Broyden, on the cell of
`benchmarks.solvers` with W scaled from one Gaussian draw to each spectral norm
of ``--composed_norms`` (its ``norm<value>`` problems): f-evaluations, convergence and
wall time to each tolerance of ``--tols``, then the time of one step from fixed-budget
runs of ``--step_budget`` steps and each combinator's overhead over its active part.
One JSON line per measurement. The flags of `benchmarks.solvers` apply.

  python -m benchmarks.composed --width 64 --batch 16 --repeats 3
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import deq_jax as dj
from benchmarks.solver_problems import header, json_lines
from benchmarks.solvers import (
    _BATCH,
    _MAX_ITER,
    _OUTPUT,
    _REPEATS,
    _SEED,
    _TOLS,
    _WIDTH,
    cell,
    compile_seconds,
    make_problem,
    relative_residual,
    timed,
)

_COMPOSED_NORMS = flags.DEFINE_list(
    "composed_norms", ["0.9", "1.5", "2.5", "3.0"], "Spectral norms of W."
)
_STEP_BUDGET = flags.DEFINE_integer(
    "step_budget", 100, "Steps of the fixed-budget runs that time one step."
)


def composed_lineup(tol_abs: float, max_iter: int) -> dict:
    """The composed solvers of issue 38 and their parts, all stopping at ``tol_abs``."""
    S = dj.solvers
    hyper = dict(tol=tol_abs, max_iter=max_iter, stop_mode="abs")
    fpi, anderson, broyden = S.fixed_point_iteration(), S.anderson(), S.broyden()
    return {
        "fixed_point_iteration": fpi.replace(**hyper),
        "anderson": anderson.replace(**hyper),
        "broyden": broyden.replace(**hyper),
        "sequence(fixed_point_iteration:3,anderson)": S.sequence((fpi, 3), anderson, **hyper),
        "fallback(anderson,broyden)": S.fallback(primary=anderson, backup=broyden, **hyper),
        # the same, with a patience no solve reaches: the bookkeeping cost alone
        "fallback(anderson,broyden,patience=budget)": S.fallback(
            primary=anderson, backup=broyden, patience=max_iter, **hyper
        ),
    }


# The part a composed solver spends its steps in, for the per-step overhead.
ACTIVE_PART = {
    "sequence(fixed_point_iteration:3,anderson)": "anderson",
    "fallback(anderson,broyden)": "anderson",
    "fallback(anderson,broyden,patience=budget)": "anderson",
}


def _timed_solve(solver, w, inj, repeats):
    run = jax.jit(lambda w, inj: dj.fixed_point(cell, jnp.zeros_like(inj), (w, inj), solver=solver))
    compile_seconds(run, w, inj)
    return timed(run, w, inj, repeats=repeats)


def composed_benchmark(emit, width, batch, seed, repeats) -> None:
    """``sequence((fixed_point_iteration, 3), anderson)`` and ``fallback(anderson,
    broyden)`` against their parts on the tanh cell at each spectral norm of
    ``--composed_norms``: f-evaluations, convergence and wall time to each tolerance,
    then the time of one step from a fixed-budget run of ``--step_budget`` steps and
    its overhead over the active part's."""
    budget = _STEP_BUDGET.value
    for norm in _COMPOSED_NORMS.value:
        problem = f"norm{norm}"
        w, inj = make_problem(problem, width, batch, seed)
        reference = dj.fixed_point(
            cell, jnp.zeros_like(inj), (w, inj), solver=dj.solvers.anderson(tol=1e-7, max_iter=2000)
        ).value
        z_norm_min = float(jnp.min(jnp.linalg.norm(cell(reference, (w, inj)), axis=1)))
        for rel_tol in map(float, _TOLS.value):
            for name, solver in composed_lineup(rel_tol * z_norm_min, _MAX_ITER.value).items():
                wall, out = _timed_solve(solver, w, inj, repeats)
                nstep = np.asarray(out.stats.nstep)
                rel = relative_residual(out.value, w, inj)
                part = out.stats.part
                emit(
                    dict(
                        composed=True,
                        problem=problem,
                        rel_tol=rel_tol,
                        solver=name,
                        f_evals_max=int(nstep.max()),
                        f_evals_mean=float(nstep.mean()),
                        converged=float(np.mean(out.stats.converged)),
                        final_rel_residual_max=float(rel.max()),
                        wall_ms=1e3 * wall,
                        switched=None if part is None else float(np.mean(np.asarray(part) > 0)),
                    )
                )
        step_ms = {}
        for name, solver in composed_lineup(1e-30, budget).items():
            wall, out = _timed_solve(solver.replace(full_budget=True), w, inj, repeats)
            step_ms[name] = 1e3 * wall / budget
            part = out.stats.part
            active = ACTIVE_PART.get(name)
            emit(
                dict(
                    composed=True,
                    problem=problem,
                    step_budget=budget,
                    solver=name,
                    ms_per_step=step_ms[name],
                    overhead_vs_active_part=(
                        None if active is None else step_ms[name] / step_ms[active] - 1.0
                    ),
                    switched=None if part is None else float(np.mean(np.asarray(part) > 0)),
                )
            )


def main(argv):
    del argv
    with json_lines(_OUTPUT.value) as emit:
        emit(header(_WIDTH.value, _BATCH.value, _MAX_ITER.value, _REPEATS.value))
        composed_benchmark(emit, _WIDTH.value, _BATCH.value, _SEED.value, _REPEATS.value)


if __name__ == "__main__":
    app.run(main)
