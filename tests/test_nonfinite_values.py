"""Non-finite values never pass a solve silently: a NaN or infinite input flags its
sample diverged, and every backward mode says, in the same words, when its gradients
are not finite."""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import contractive_matrix

import deq_jax as dj
from deq_jax import backward, solvers
from deq_jax.backward.nonfinite import NonFiniteGradientWarning, nonfinite_message, nonfinite_rows
from deq_jax.fixed_point import solve_until_settled
from deq_jax.nn import DEQ, MLPCell

B, D, C = 4, 6, 3
BAD = 1  # the sample given an infinite input


def injected_cell(z, args):
    """``tanh(z W + x U)``: an infinite ``x`` saturates the state but poisons ``dU``."""
    w, u, x = args
    return jnp.tanh(z @ w + x @ u)


def problem(bad_value=np.inf):
    kw, ku, kx = jax.random.split(jax.random.key(0), 3)
    w = contractive_matrix(kw, D, 0.5)
    u = jax.random.normal(ku, (C, D)) / np.sqrt(C)
    x = jax.random.normal(kx, (B, C))
    if bad_value is not None:
        x = x.at[BAD, 0].set(bad_value)
    return w, u, x


def solve(args, mode=None, solver=None):
    solver = solver or solvers.anderson(tol=1e-5, max_iter=50)
    return dj.fixed_point(
        injected_cell, jnp.zeros((B, D)), args, solver=solver, backward=mode or backward.ift()
    )


_jit_solve = jax.jit(solve)  # one program for the infinite and the NaN input


# --- Forward: the sample is flagged -------------------------------------------------------


@pytest.mark.parametrize("bad_value", [np.inf, np.nan])
@pytest.mark.parametrize("jit", [False, True])
def test_nonfinite_input_flags_its_sample_diverged(bad_value, jit):
    args = problem(bad_value)
    stats = (_jit_solve if jit else solve)(args).stats
    others = np.arange(B) != BAD
    assert bool(stats.diverged[BAD]) and not bool(stats.converged[BAD])
    assert np.all(np.asarray(stats.converged)[others])
    assert not np.any(np.asarray(stats.diverged)[others])


def test_infinite_input_used_to_look_converged():
    """The reason for the flag: the saturated state's residual is small and finite."""
    args = problem()
    z = solve(args).value
    residual = jnp.linalg.norm(injected_cell(z, args) - z, axis=-1)
    assert bool(jnp.all(jnp.isfinite(z))) and float(residual[BAD]) < 1e-4


def test_nonfinite_parameter_flags_every_sample():
    w, u, x = problem(bad_value=None)
    stats = solve((w, u.at[0, 0].set(np.inf), x)).stats
    assert bool(jnp.all(stats.diverged)) and not bool(jnp.any(stats.converged))


def test_nonfinite_rows_reads_batched_leaves_per_sample():
    tree = {
        "x": jnp.ones((3, 2)).at[2, 1].set(np.nan),
        "key": jax.random.key(0),
        "ids": jnp.arange(3),
    }
    np.testing.assert_array_equal(nonfinite_rows(tree, 3), [False, False, True])
    tree["w"] = jnp.full((5,), np.inf)
    np.testing.assert_array_equal(nonfinite_rows(tree, 3), [True, True, True])


def test_solve_until_settled_flags_a_nonfinite_input():
    args = problem()
    readout = lambda z: z > 0
    sol = solve_until_settled(
        injected_cell, jnp.zeros((B, D)), args, solver=solvers.anderson(), readout=readout
    )
    assert bool(sol.stats.diverged[BAD]) and not bool(sol.stats.converged[BAD])


# --- Backward: one message for every mode -------------------------------------------------

MODES = {
    "ift": backward.ift(),
    "phantom": backward.phantom(k=3, tau=0.5),
    "jacobian_free": backward.jacobian_free(),
    "unrolled": backward.unrolled(),
}


@functools.lru_cache
def _jit_grads(mode, solver):
    """The jitted gradient program of one mode, compiled once for the module: the
    finite and non-finite problems share it (``x`` is an argument, not a constant)."""
    loss = lambda w, u, x: jnp.sum(solve((w, u, x), mode, solver).value ** 2)
    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def grads(args, mode, solver=None):
    g = _jit_grads(mode, solver)(*args)
    jax.effects_barrier()  # the warning comes from a debug callback, on every run
    return g


@pytest.mark.parametrize("name", MODES)
def test_every_mode_says_its_gradients_are_nonfinite(name):
    expected = nonfinite_message(name, 1, B, 1, 0)
    assert expected.startswith(
        f"deq_jax: {name} backward produced non-finite gradients for 1 of {B} samples (1 with "
        "a diverged forward solve or a non-finite input)"
    )
    with pytest.warns(NonFiniteGradientWarning) as record:
        _, du = grads(problem(), MODES[name])
    assert not bool(jnp.all(jnp.isfinite(du)))
    assert [str(r.message) for r in record if r.category is NonFiniteGradientWarning] == [expected]


def test_ift_nan_on_failure_says_so():
    slow = backward.ift(
        solver=solvers.fixed_point_iteration(tol=1e-9, max_iter=2), on_failure="nan"
    )
    with pytest.warns(NonFiniteGradientWarning) as record:
        dw, _ = grads(problem(bad_value=None), slow)
    assert bool(jnp.all(jnp.isnan(dw)))
    (message,) = [str(r.message) for r in record if r.category is NonFiniteGradientWarning]
    assert message == nonfinite_message("ift", B, B, 0, 0)
    assert "ift(on_failure='nan')" in message


def test_ift_does_not_call_nan_gradients_inaccurate():
    """A NaN parameter: the backward solve fails too, but the gradients are NaN, not
    "inaccurate"; only the non-finite warning speaks."""
    w, u, x = problem(bad_value=None)
    w = w.at[0, 0].set(np.nan)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dw, _ = grads((w, u, x), backward.ift(on_failure="warn"))
    categories = [r.category for r in record]
    assert backward.BackwardSolveWarning not in categories
    assert categories.count(NonFiniteGradientWarning) == 1
    assert not bool(jnp.all(jnp.isfinite(dw)))


@pytest.mark.parametrize("name", MODES)
def test_finite_gradients_say_nothing(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chex.assert_tree_all_finite(grads(problem(bad_value=None), MODES[name]))


def test_gradient_is_unchanged_by_the_watch():
    """The watched solve passes the mode's own gradient through: IFT against the
    analytic one on an affine map (x64-free: a small, well-conditioned problem)."""
    a = contractive_matrix(jax.random.key(3), 3, 0.5)
    b = jnp.arange(3.0)
    f = lambda z, ab: ab[0] @ z + ab[1]
    solver = solvers.anderson(tol=1e-7, max_iter=100)
    loss = lambda b: jnp.sum(dj.fixed_point(f, jnp.zeros(3), (a, b), solver=solver).value)
    expected = np.linalg.inv(np.eye(3) - np.asarray(a)).T @ np.ones(3)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(b), expected, rtol=1e-4)


# --- The DEQ layer ------------------------------------------------------------------------


def test_deq_layer_flags_an_infinite_input_and_warns():
    x = jax.random.normal(jax.random.key(1), (B, C)).at[BAD, 2].set(np.inf)
    model = DEQ(MLPCell(features=D))
    params = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(jnp.ones((B, C)))
    params = params["params"]
    _, stats = jax.jit(lambda p: model.apply({"params": p}, x, train=False))(params)
    assert bool(stats.diverged[BAD]) and not bool(stats.converged[BAD])
    assert int(jnp.sum(stats.converged)) == B - 1
    loss = lambda p: jnp.sum(model.apply({"params": p}, x, train=True)[0])
    with pytest.warns(NonFiniteGradientWarning, match=f"for 1 of {B} samples"):
        g = jax.jit(jax.grad(loss))(params)
        jax.effects_barrier()
    assert not bool(jnp.all(jnp.isfinite(g["cell"]["inject"]["kernel"])))
