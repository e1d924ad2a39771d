"""`fixed_point` argument checking and bad input."""

import jax.numpy as jnp
import pytest
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax import solvers


def test_output_shape_mismatch_names_both_shapes():
    f = lambda z, w: z @ w  # [4, 3] @ [3, 5] -> [4, 5]
    with pytest.raises(
        ValueError, match=r"z0 is float32\[4,3\] but f\(z0, args\) is float32\[4,5\]"
    ):
        dj.fixed_point(f, jnp.zeros((4, 3)), jnp.ones((3, 5)), solver=solvers.anderson())


def test_output_dtype_mismatch():
    f = lambda z, _: z.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match=r"float32\[2,2\] but f\(z0, args\) is bfloat16\[2,2\]"):
        dj.fixed_point(f, jnp.zeros((2, 2)), None, solver=solvers.anderson())


def test_output_structure_mismatch():
    f = lambda z, _: {"a": z["a"]}
    z0 = {"a": jnp.zeros((2, 2)), "b": jnp.zeros((2, 1))}
    with pytest.raises(ValueError, match="must return a pytree with the structure"):
        dj.fixed_point(f, z0, None, solver=solvers.anderson())


def test_batched_state_needs_a_common_batch_axis():
    z0 = {"a": jnp.zeros((2, 3)), "b": jnp.zeros((3, 3))}
    with pytest.raises(ValueError, match="common leading batch axis"):
        dj.fixed_point(lambda z, _: z, z0, None, solver=solvers.anderson())


def test_integer_state_is_rejected():
    with pytest.raises(ValueError, match="must be a float array"):
        dj.fixed_point(
            lambda z, _: z, jnp.zeros((2, 3), jnp.int32), None, solver=solvers.anderson()
        )


def test_solver_and_backward_types_are_checked():
    w, x = tanh_problem(__import__("jax").random.PRNGKey(0))
    with pytest.raises(TypeError, match="solver must be a deq_jax Solver"):
        dj.fixed_point(tanh_cell, x, (w, x), solver="anderson")
    with pytest.raises(TypeError, match="backward must be a deq_jax backward mode"):
        dj.fixed_point(tanh_cell, x, (w, x), solver=solvers.anderson(), backward="ift")


def test_unbatched_vector_state():
    """batched=False treats a [d] state as one problem (one nstep, scalar statistics)."""
    f = lambda z, _: 0.5 * z[::-1] + 1.0  # couples the coordinates
    sol = dj.fixed_point(f, jnp.zeros(4), None, solver=solvers.anderson(tol=1e-6), batched=False)
    assert sol.stats.nstep.shape == ()
    assert sol.stats.trace.shape == (50,)
    assert jnp.allclose(sol.value, 2.0, atol=1e-5)


def test_budget_given_at_the_call():
    """``max_iter=`` at the call overrides the solver's own budget, forward and backward."""
    import jax

    w, x = tanh_problem(jax.random.PRNGKey(0))
    solver = solvers.anderson(tol=1e-12, max_iter=50)
    at_call = dj.fixed_point(tanh_cell, x, (w, x), solver=solver, max_iter=4)
    in_solver = dj.fixed_point(tanh_cell, x, (w, x), solver=solver.replace(max_iter=4))
    assert at_call.stats.trace.shape[-1] == 4 and int(at_call.stats.nstep.max()) == 4
    assert jnp.array_equal(at_call.value, in_solver.value)
    grad = lambda **kw: jax.jit(  # one program each, not each op compiled eagerly
        jax.grad(lambda w_: dj.fixed_point(tanh_cell, x, (w_, x), **kw).value.sum())
    )(w)
    assert jnp.array_equal(grad(solver=solver, max_iter=4), grad(solver=solver.replace(max_iter=4)))


def test_full_budget_runs_every_sample_to_the_budget():
    """``full_budget=True`` ignores ``tol`` for stopping (a fixed depth) and returns what
    the old "tolerance no sample reaches" idiom did (which stopped a sample only once
    its residual was exactly 0); ``tol`` still decides ``converged``."""
    import jax

    w, x = tanh_problem(jax.random.PRNGKey(0))
    full = solvers.fixed_point_iteration(tol=1e-3, max_iter=30, full_budget=True)
    sol = dj.fixed_point(tanh_cell, x, (w, x), solver=full)
    never = dj.fixed_point(tanh_cell, x, (w, x), solver=full.replace(tol=1e-30, full_budget=False))
    early = dj.fixed_point(tanh_cell, x, (w, x), solver=full.replace(full_budget=False))
    assert jnp.all(sol.stats.nstep == 30)
    assert int(early.stats.nstep.max()) < 30  # the same tol stops early without it
    assert jnp.array_equal(sol.value, never.value)
    assert jnp.array_equal(sol.stats.converged, sol.stats.rel_residual <= 1e-3)
    short = dj.fixed_point(tanh_cell, x, (w, x), solver=full.replace(max_iter=2))
    assert not jnp.any(short.stats.converged) and jnp.all(short.stats.nstep == 2)
