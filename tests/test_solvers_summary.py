"""Printed statistics: `SolverStats` and `Solution` read as a summary, the trace on request."""

import jax
import jax.numpy as jnp
import numpy as np
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax import solvers as S

B, D = 6, 16


def _solve(solver, jit=False):
    args = tanh_problem(jax.random.PRNGKey(0), batch=B, d=D, norm=0.9)
    run = lambda args: dj.fixed_point(tanh_cell, jnp.zeros((B, D)), args, solver=solver)
    return (jax.jit(run) if jit else run)(args)


def test_stats_print_as_one_line_of_numbers_from_the_arrays():
    stats = _solve(S.anderson(tol=1e-5, max_iter=40)).stats
    line = repr(stats)
    assert str(stats) == line and "\n" not in line
    nstep = np.asarray(stats.nstep)
    assert line.startswith(f"SolverStats(shape [{B}], budget 40, ")
    assert f"nstep mean {nstep.mean():.3g} max {nstep.max()}" in line
    assert f"abs_residual mean {np.mean(stats.abs_residual):.3g}" in line
    assert f"rel_residual mean {np.mean(stats.rel_residual):.3g}" in line
    assert f"max {np.max(stats.rel_residual):.3g}" in line
    assert f"converged {B}/{B}, diverged 0/{B}" in line
    assert "part" not in line and len(line) < 300  # not the [B, 40] trace


def test_the_trace_prints_on_request():
    stats = _solve(S.anderson(tol=1e-5, max_iter=40)).stats
    full = stats.summary(trace=True)
    head, body = full.split("\ntrace:\n")
    assert head == repr(stats)
    rows = np.asarray(stats.trace)
    assert body.count("[") == B + 1  # every row of the [B, 40] trace, none elided
    assert "..." not in body and f"{rows[0, 0]:.3f}" in body


def test_composed_solver_stats_count_the_parts():
    stats = _solve(S.sequence((S.fixed_point_iteration(), 3), S.anderson(), tol=1e-5)).stats
    part = np.asarray(stats.part)
    codes, counts = np.unique(part, return_counts=True)
    want = " ".join(f"{c}:{n}" for c, n in zip(codes, counts, strict=True))
    assert f"part {want}, switched_at max 3" in repr(stats)


def test_diverged_and_unbatched_stats():
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=B, d=D, norm=0.9)
    x = x.at[1, 0].set(jnp.nan)
    stats = dj.fixed_point(tanh_cell, jnp.zeros((B, D)), (w, x), solver=S.anderson()).stats
    assert f"converged {B - 1}/{B}, diverged 1/{B}" in repr(stats)
    single = dj.fixed_point(lambda z, _: jnp.cos(z), jnp.array(1.0), None, solver=S.anderson())
    assert repr(single.stats).startswith("SolverStats(shape [], budget 50, nstep mean")
    assert "converged 1/1" in repr(single.stats)


def test_printing_under_jit_names_shapes_and_reads_no_value():
    printed = []

    def run(args):
        sol = dj.fixed_point(tanh_cell, jnp.zeros((B, D)), args, solver=S.anderson(max_iter=30))
        printed.extend([repr(sol.stats), repr(sol), sol.stats.summary(trace=True)])
        return sol.value

    jax.jit(run)(tanh_problem(jax.random.PRNGKey(0), batch=B, d=D, norm=0.9))
    stats_line, solution_line, with_trace = printed
    assert stats_line.startswith(f"SolverStats(traced: nstep=int32[{B}], abs_residual=float32")
    assert f"trace=float32[{B},30]" in stats_line and with_trace == stats_line
    assert solution_line == f"Solution(value=float32[{B},{D}], stats={stats_line})"


def test_stats_that_hold_no_arrays_print_their_fields():
    # jax.tree_util maps a SolverStats to one of shapes, axes, ...: its repr still prints
    stats = _solve(S.anderson()).stats
    shapes = jax.tree_util.tree_map(lambda a: a.shape, stats)
    assert repr(shapes) == (
        f"SolverStats(nstep=({B},), abs_residual=({B},), rel_residual=({B},), "
        f"converged=({B},), diverged=({B},), trace=({B}, 50), part=None, switched_at=None, "
        "floor=None, at_floor=None)"
    )
    axes = S.SolverStats(*([0] * 6))
    assert repr(axes).startswith("SolverStats(nstep=0, abs_residual=0")
    # numpy copies (jax.device_get) and stacked stats (e.g. [steps, B]) summarise too
    stacked = jax.tree_util.tree_map(lambda a: np.stack([a, a]), jax.device_get(stats))
    assert repr(stacked).startswith(f"SolverStats(shape [2, {B}], budget 50, nstep mean")
    assert f"converged {2 * B}/{2 * B}" in repr(stacked)


def test_solution_prints_the_value_shapes_and_the_stats_summary():
    sol = _solve(S.anderson())
    assert repr(sol) == f"Solution(value=float32[{B},{D}], stats={sol.stats!r})"
    tree = S.Solution(value={"a": sol.value, "b": sol.value[:, :2]}, stats=sol.stats)
    assert "float32[6,16], float32[6,2]" in repr(tree)
