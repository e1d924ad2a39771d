"""Backward modes: exact implicit gradients, approximations, and failure reporting."""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from problems import contractive_matrix, jit_as_users_compile, tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax import backward, solvers

BACKWARD_SOLVERS = {
    "fixed_point_iteration": lambda tol: solvers.fixed_point_iteration(tol=tol, max_iter=500),
    "anderson": lambda tol: solvers.anderson(tol=tol, max_iter=200),
    "broyden": lambda tol: solvers.broyden(tol=tol, max_iter=200),
    "gmres": lambda tol: backward.gmres(tol=tol),
}


def cosine(a, b):
    a, b = jnp.ravel(a), jnp.ravel(b)
    return float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))


def affine_fixed_point(a, b, mode, tol):
    f = lambda z, ab: ab[0] @ z + ab[1]
    solver = solvers.anderson(tol=tol, max_iter=200)
    return dj.fixed_point(
        f, jnp.zeros_like(b), (a, b), solver=solver, backward=mode, batched=False
    ).value


@pytest.mark.parametrize("name", BACKWARD_SOLVERS)
def test_ift_on_affine_map_equals_the_analytic_gradient(name, x64):
    d = 5
    a = contractive_matrix(jax.random.PRNGKey(0), d, 0.7, "float64")
    b = jax.random.normal(jax.random.PRNGKey(1), (d,), "float64")
    w = jax.random.normal(jax.random.PRNGKey(2), (d,), "float64")
    mode = backward.ift(solver=BACKWARD_SOLVERS[name](1e-12))
    loss = lambda a, b: w @ affine_fixed_point(a, b, mode, 1e-13)
    grad_a, grad_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b)
    inv_t = np.linalg.inv(np.eye(d) - np.asarray(a)).T
    u = inv_t @ np.asarray(w)  # dL/db = (I - A)^-T w
    z_star = np.linalg.solve(np.eye(d) - np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(grad_b, u, rtol=1e-9)
    np.testing.assert_allclose(grad_a, np.outer(u, z_star), rtol=1e-9, atol=1e-12)


def tanh_loss(mode, tol=1e-13):
    """A scalar loss of the tanh cell's fixed point, as a function of (W, x)."""
    solver = solvers.anderson(tol=tol, max_iter=300)

    def loss(w, x):
        probe = jax.random.normal(jax.random.PRNGKey(42), x.shape, x.dtype)
        z = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver, backward=mode)
        return jnp.sum(probe * z.value**2)

    return loss


def central_differences(loss, w, x, eps=1e-6):
    grads = []
    for arg_index, arg in enumerate((w, x)):
        g = np.zeros(arg.size)
        for i in range(arg.size):
            e = jnp.zeros(arg.size, arg.dtype).at[i].set(eps).reshape(arg.shape)
            plus = [w, x]
            minus = [w, x]
            plus[arg_index] = arg + e
            minus[arg_index] = arg - e
            g[i] = (loss(*plus) - loss(*minus)) / (2 * eps)
        grads.append(g.reshape(arg.shape))
    return grads


@pytest.mark.parametrize("name", ["anderson", "broyden", "gmres"])
def test_ift_matches_finite_differences_on_a_nonlinear_cell(name, x64):
    w, x = tanh_problem(jax.random.PRNGKey(3), batch=4, d=6, norm=0.8, dtype="float64")
    loss = tanh_loss(backward.ift(solver=BACKWARD_SOLVERS[name](1e-13)))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x)
    fd = central_differences(jax.jit(loss), w, x)
    for g, expected in zip(grads, fd, strict=True):
        rel = np.linalg.norm(np.asarray(g) - expected) / np.linalg.norm(expected)
        assert rel < 1e-5, rel


def test_ift_matches_unrolled_to_convergence(x64):
    w, x = tanh_problem(jax.random.PRNGKey(4), batch=4, d=6, norm=0.8, dtype="float64")
    g_ift = jax.grad(tanh_loss(backward.ift()), argnums=(0, 1))(w, x)
    g_unrolled = jax.grad(tanh_loss(backward.unrolled()), argnums=(0, 1))(w, x)
    chex.assert_trees_all_close(g_ift, g_unrolled, rtol=1e-8, atol=1e-12)


def test_check_grads_rev(x64):
    w, x = tanh_problem(jax.random.PRNGKey(5), batch=2, d=4, norm=0.6, dtype="float64")
    check_grads(jax.jit(tanh_loss(backward.ift())), (w, x), order=1, modes=["rev"])


@functools.lru_cache
def _contractive_exact_gradient():
    """The cell and exact gradient of `test_inexact_gradients_point_the_right_way`,
    computed once for its three cases (call under x64)."""
    w, x = tanh_problem(jax.random.PRNGKey(6), batch=4, d=8, norm=0.5, dtype="float64")
    return w, x, jax.jit(jax.grad(tanh_loss(backward.ift())))(w, x)


@pytest.mark.parametrize(
    "mode, bound",
    [
        (backward.phantom(k=5, tau=1.0), 0.99),
        (backward.phantom(k=10, tau=0.5), 0.99),
        (backward.jacobian_free(), 0.8),
    ],
    ids=["phantom_k5", "phantom_k10_tau0.5", "jacobian_free"],
)
def test_inexact_gradients_point_the_right_way(mode, bound, x64):
    """On a contractive cell (Lipschitz 0.5) the approximations align with the exact one."""
    w, x, exact = _contractive_exact_gradient()
    approx = jax.jit(jax.grad(tanh_loss(mode)))(w, x)
    cos = cosine(approx, exact)
    print(f"{mode}: cosine similarity with the exact gradient {cos:.5f}")
    assert cos > bound


def test_inexact_modes_return_the_solver_value():
    w, x = tanh_problem(jax.random.PRNGKey(7))
    solver = solvers.anderson(tol=1e-5)
    values = [
        dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver, backward=m).value
        for m in (backward.ift(), backward.phantom(), backward.jacobian_free())
    ]
    np.testing.assert_array_equal(values[1], values[0])
    np.testing.assert_array_equal(values[2], values[0])


def test_phantom_tends_to_the_exact_gradient_as_k_grows(x64):
    w, x = tanh_problem(jax.random.PRNGKey(8), batch=2, d=6, norm=0.7, dtype="float64")
    # jitted: one program a mode, not each op compiled eagerly (as in the tests below;
    # test_ift_matches_unrolled_to_convergence keeps the eager gradients)
    grad = lambda mode: jax.jit(jax.grad(tanh_loss(mode)))(w, x)
    exact = grad(backward.ift())
    errors = [float(jnp.linalg.norm(grad(backward.phantom(k=k)) - exact)) for k in (1, 5, 40)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-5 * float(jnp.linalg.norm(exact))


def test_no_gradient_reaches_z0():
    w, x = tanh_problem(jax.random.PRNGKey(9), batch=2, d=4)
    for mode in (backward.ift(), backward.unrolled(), backward.phantom()):
        # jitted: one program a mode, not each of its ops compiled eagerly
        g = jax.jit(
            jax.grad(
                lambda z0, mode=mode: jnp.sum(
                    dj.fixed_point(
                        tanh_cell, z0, (w, x), solver=solvers.anderson(), backward=mode
                    ).value
                )
            )
        )(jnp.ones_like(x))
        np.testing.assert_array_equal(g, 0.0)


def test_gradient_reaches_closed_over_arrays(x64):
    w, x = tanh_problem(jax.random.PRNGKey(10), batch=2, d=4, norm=0.6, dtype="float64")
    solver = solvers.anderson(tol=1e-13, max_iter=200)

    def loss_closure(w):
        f = lambda z, x: jnp.tanh(z @ w + x)  # w is closed over, not passed in args
        return jnp.sum(dj.fixed_point(f, jnp.zeros_like(x), x, solver=solver).value)

    def loss_args(w):
        return jnp.sum(dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver).value)

    grad = lambda loss: jax.jit(jax.grad(loss))(w)
    np.testing.assert_allclose(grad(loss_closure), grad(loss_args), rtol=1e-10)


def test_integer_leaves_in_args_are_allowed():
    w, x = tanh_problem(jax.random.PRNGKey(11), batch=2, d=4)
    f = lambda z, args: jnp.tanh(z @ args["w"] + args["x"]) * (args["n"] > 0)
    solver = solvers.anderson()
    for mode in (backward.ift(), backward.phantom(), backward.unrolled()):
        # jitted: one program a mode, not each of its ops compiled eagerly
        g = jax.jit(
            jax.grad(
                lambda w, mode=mode: jnp.sum(
                    dj.fixed_point(
                        f,
                        jnp.zeros_like(x),
                        {"w": w, "x": x, "n": jnp.array(3)},
                        solver=solver,
                        backward=mode,
                    ).value
                )
            )
        )(w)
        chex.assert_tree_all_finite(g)
        assert float(jnp.linalg.norm(g)) > 0


def test_grad_of_vmap_and_jit(x64):
    keys = jax.random.split(jax.random.PRNGKey(12), 3)
    ws, xs = jax.vmap(lambda k: tanh_problem(k, batch=2, d=4, dtype="float64"))(keys)
    loss = tanh_loss(backward.ift())
    per_problem = jax.jit(jax.vmap(jax.grad(lambda w, x: loss(w, x))))(ws, xs)
    one = jax.jit(jax.grad(loss))  # one program for the three problems, not three eager runs
    for i in range(3):
        np.testing.assert_allclose(per_problem[i], one(ws[i], xs[i]), rtol=1e-9)


# --- Failure of the backward solve ------------------------------------------------------


def slow_backward_grad(on_failure):
    w, x = tanh_problem(jax.random.PRNGKey(13), batch=2, d=8, norm=0.95)
    mode = backward.ift(
        solver=solvers.fixed_point_iteration(tol=1e-7, max_iter=3), on_failure=on_failure
    )
    loss = lambda w: jnp.sum(
        dj.fixed_point(
            tanh_cell, jnp.zeros_like(x), (w, x), solver=solvers.anderson(), backward=mode
        ).value
    )
    g = jax.jit(jax.grad(loss))(w)
    return jax.block_until_ready(g)


def test_backward_failure_warns():
    with pytest.warns(backward.BackwardSolveWarning, match="did not converge for 2 of 2"):
        slow_backward_grad("warn")


def test_backward_failure_can_poison_gradients():
    assert bool(jnp.all(jnp.isnan(slow_backward_grad("nan"))))


def test_backward_failure_can_be_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chex.assert_tree_all_finite(slow_backward_grad("ignore"))


def test_converged_backward_does_not_warn():
    w, x = tanh_problem(jax.random.PRNGKey(14))
    loss = lambda w: jnp.sum(
        dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solvers.anderson()).value
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.block_until_ready(jax.jit(jax.grad(loss))(w))


# --- Registry ---------------------------------------------------------------------------


def test_backward_registry():
    assert backward.get("phantom", k=3) == backward.phantom(k=3)
    assert backward.get("ift", solver="broyden").solver == solvers.broyden()
    assert backward.get("ift", solver="gmres").solver == backward.gmres()
    with pytest.raises(ValueError, match="ift, jacobian_free, phantom, reversible, unrolled"):
        backward.get("adjoint")
    with pytest.raises(ValueError, match="Valid keywords: k, tau"):
        backward.get("phantom", steps=3)
    with pytest.raises(ValueError, match="on_failure must be one of warn, nan, ignore"):
        backward.ift(on_failure="raise")
    with pytest.raises(ValueError, match="Unknown solver 'newton'"):
        backward.ift(solver="newton")


# --- The stats probe --------------------------------------------------------------------


def test_stats_probe_reports_the_backward_solve():
    w, x = tanh_problem(jax.random.PRNGKey(15), batch=4, d=8, norm=0.9)
    bwd_solver = solvers.fixed_point_iteration(tol=1e-6, max_iter=200)

    def loss(w, probe, mode):
        sol = dj.fixed_point(
            tanh_cell,
            jnp.zeros_like(x),
            (w, x),
            solver=solvers.anderson(),
            backward=mode,
            stats_probe=probe,
        )
        return jnp.sum(sol.value)

    probe = backward.stats_probe()
    g_w, g_probe = jit_as_users_compile(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(
        w, probe, backward.ift(solver=bwd_solver)
    )
    stats = backward.read_stats_probe(g_probe)
    assert set(stats) == set(backward.BACKWARD_STATS)
    assert 1 < float(stats["nstep_max"]) < 200
    assert float(stats["nstep_mean"]) <= float(stats["nstep_max"])
    assert 0 < float(stats["abs_residual_max"]) <= 1e-6 * 20
    assert float(stats["converged_fraction"]) == 1.0
    # Gradients are unchanged by the probe; modes without a backward solve report zeros.
    g_plain = jit_as_users_compile(jax.grad(loss), static_argnums=2)(
        w, None, backward.ift(solver=bwd_solver)
    )
    np.testing.assert_allclose(g_w, g_plain, rtol=1e-5, atol=1e-7)
    _, g_phantom = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(
        w, probe, backward.phantom()
    )
    np.testing.assert_array_equal(g_phantom, 0.0)


def test_stats_probe_sees_a_failed_backward_solve():
    w, x = tanh_problem(jax.random.PRNGKey(16), batch=2, d=8, norm=0.95)
    mode = backward.ift(
        solver=solvers.fixed_point_iteration(tol=1e-7, max_iter=3), on_failure="ignore"
    )
    loss = lambda w, probe: jnp.sum(
        dj.fixed_point(
            tanh_cell,
            jnp.zeros_like(x),
            (w, x),
            solver=solvers.anderson(),
            backward=mode,
            stats_probe=probe,
        ).value
    )
    _, g_probe = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, backward.stats_probe())
    stats = backward.read_stats_probe(g_probe)
    assert float(stats["converged_fraction"]) == 0.0
    assert float(stats["nstep_max"]) == 3.0
