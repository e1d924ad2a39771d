"""Property tests on random contractive maps: the statistics never lie."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax import solvers

SOLVER_NAMES = ["fixed_point_iteration", "anderson", "broyden"]


@functools.partial(jax.jit, static_argnames="solver")
def solve(w, x, solver):
    return dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(SOLVER_NAMES),
    seed=st.integers(0, 2**31 - 1),
    norm=st.floats(0.05, 0.99),
    tol=st.sampled_from([1e-3, 1e-5]),
    max_iter=st.sampled_from([1, 6, 40]),
    stop_mode=st.sampled_from(["abs", "rel"]),
)
def test_statistics_on_random_contractive_maps(name, seed, norm, tol, max_iter, stop_mode):
    solver = solvers.get(name, tol=tol, max_iter=max_iter, stop_mode=stop_mode)
    w, x = tanh_problem(jax.random.PRNGKey(seed), batch=4, d=8, norm=norm)
    sol = solve(w, x, solver)
    stats = jax.tree_util.tree_map(np.asarray, sol.stats)
    residual = stats.rel_residual if stop_mode == "rel" else stats.abs_residual
    assert np.all((residual <= tol) | ~stats.converged)
    assert np.all(stats.converged == (residual <= tol))
    assert np.all((1 <= stats.nstep) & (stats.nstep <= max_iter))
    assert not stats.diverged.any()
    assert np.all(np.isfinite(np.asarray(sol.value)))
    # The statistics describe the returned value.
    fz = tanh_cell(sol.value, (w, x))
    np.testing.assert_allclose(
        stats.abs_residual, np.linalg.norm(fz - sol.value, axis=1), rtol=1e-4, atol=1e-7
    )
    # Samples that did not converge used the whole budget.
    assert np.all(stats.converged | (stats.nstep == max_iter))
