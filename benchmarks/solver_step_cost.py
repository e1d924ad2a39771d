r"""The cost of one solver step relative to one fixed-point step, on the benchmark cell.

Every solver runs its whole budget (``full_budget=True``, ``--steps`` f-evaluations) on
the same batch of `benchmarks.solvers`' cell z = tanh(W z + U x + b), so the
only difference between two runs is what the solver does per step. The runs are
interleaved (one of each solver per round, ``--repeats`` rounds after a warm-up) and
the median per step is reported, as wall time and as CPU time of this process (CPU
time is less disturbed by other processes on a shared machine). One JSON line per
solver: ``{"solver", "wall_us", "cpu_us", "wall_ratio", "cpu_ratio"}``, the ratios
relative to fixed_point_iteration.

As recorded in BUILD_NOTES.md:

  python -m benchmarks.solver_step_cost --repeats 31
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

import deq_jax as dj
from benchmarks.solver_problems import cell, make_problem, over_active

_WIDTH = flags.DEFINE_integer("width", 256, "State width D.")
_BATCH = flags.DEFINE_integer("batch", 64, "Batch size B.")
_REPEATS = flags.DEFINE_integer("repeats", 31, "Timed rounds (median).")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed of the problem.")
_STEPS = flags.DEFINE_integer("steps", 100, "f-evaluations per run (the whole budget).")
_PROBLEM = flags.DEFINE_string("problem", "norm0.9", "A problem of benchmarks.solvers.")

# name -> (solver spec, keyword sections by solver name); fixed_point_iteration first:
# the unit. The composed solvers (`deq_jax.solvers.sequence`, `fallback`, `restart`)
# measure what a combinator adds per step over the part that is active: their
# "no switch" rows never fire (patience past the budget; norm 0.9 neither diverges nor
# proposes non-finite values), so Anderson makes every step; the other rows let the
# stall rule fire past convergence and so mix in backup steps and restarts.
NEVER = {"patience": 10_000}
SOLVERS = {
    "fixed_point_iteration": ("fixed_point_iteration", {}),
    "anderson": ("anderson", {}),
    "broyden": ("broyden", {}),
    "broyden_whole_budget": ("broyden", {"broyden": {"memory": None}}),
    "sequence(fixed_point_iteration:3, anderson)": (
        "sequence(fixed_point_iteration:3, anderson)",
        {},
    ),
    "fallback(anderson, broyden), no switch": ("fallback(anderson, broyden)", {"fallback": NEVER}),
    "restart(anderson), no restart": ("restart(anderson)", {"restart": NEVER}),
    "fallback(anderson, broyden)": ("fallback(anderson, broyden)", {}),
    "restart(anderson)": ("restart(anderson)", {}),
}
# name -> the steps of its parts, to price the part that is active: the combinator's
# overhead is its time over sum(steps x the part's own time per step) / budget.
ACTIVE = {
    "sequence(fixed_point_iteration:3, anderson)": {"fixed_point_iteration": 3, "anderson": None},
    "fallback(anderson, broyden), no switch": {"anderson": None},
    "restart(anderson), no restart": {"anderson": None},
}


def main(argv):
    del argv
    w, inj = make_problem(_PROBLEM.value, _WIDTH.value, _BATCH.value, _SEED.value)
    runs = {}
    for name, (spec, hyper) in SOLVERS.items():
        solver = dj.solvers.from_spec(spec, hyper, max_iter=_STEPS.value, full_budget=True)
        runs[name] = jax.jit(
            lambda w, inj, solver=solver: dj.fixed_point(
                cell, jnp.zeros_like(inj), (w, inj), solver=solver
            )
        )
        jax.block_until_ready(runs[name](w, inj))  # compile and warm up
    wall = {name: [] for name in runs}
    cpu = {name: [] for name in runs}
    for _ in range(_REPEATS.value):
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(run(w, inj))
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    per_step = lambda times: 1e6 * statistics.median(times) / _STEPS.value
    unit = "fixed_point_iteration"
    for name in runs:
        row = dict(
            solver=name,
            problem=_PROBLEM.value,
            wall_us=per_step(wall[name]),
            cpu_us=per_step(cpu[name]),
            wall_ratio=per_step(wall[name]) / per_step(wall[unit]),
            cpu_ratio=per_step(cpu[name]) / per_step(cpu[unit]),
        )
        if name in ACTIVE:
            row["cpu_over_active"] = over_active(cpu, name, ACTIVE[name], _STEPS.value)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
