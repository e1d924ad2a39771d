"""Forward solvers: known fixed points, per-sample stopping, divergence, kernels."""

import functools
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import (
    COS_FIXED_POINT,
    contractive_matrix,
    reference_fixed_point,
    tanh_cell,
    tanh_problem,
)

import deq_jax as dj
from deq_jax import solvers

SOLVERS = {
    "fixed_point_iteration": dict(),
    "damped_iteration": dict(tau=0.8),
    "anderson": dict(),
    "broyden": dict(),
}


def make_solver(name, **hyper):
    ctor = "fixed_point_iteration" if name == "damped_iteration" else name
    return solvers.get(ctor, **{**SOLVERS[name], **hyper})


def solve(f, z0, args, solver, jit):
    run = lambda z0, args: dj.fixed_point(f, z0, args, solver=solver)
    return (jax.jit(run) if jit else run)(z0, args)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", SOLVERS)
def test_cos_fixed_point(name, jit, dtype):
    tol = 1e-6 if dtype == "float32" else 1e-12
    solver = make_solver(name, tol=tol, max_iter=200, stop_mode="abs")
    sol = solve(lambda z, _: jnp.cos(z), jnp.array(1.0, dtype), None, solver, jit)
    assert sol.value.dtype == jnp.dtype(dtype)
    assert sol.value.shape == ()
    assert bool(sol.stats.converged)
    assert abs(float(jnp.cos(sol.value)) - float(sol.value)) <= tol
    np.testing.assert_allclose(float(sol.value), COS_FIXED_POINT, atol=10 * tol)


@pytest.mark.parametrize("name", SOLVERS)
def test_affine_map_matches_closed_form(name, dtype):
    d = 6
    a = contractive_matrix(jax.random.PRNGKey(0), d, 0.6, dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (d,), dtype)
    tol = 1e-6 if dtype == "float32" else 1e-13
    solver = make_solver(name, tol=tol, max_iter=300)
    # A [d] vector with batched=None would be read as a batch of scalars; say so explicitly.
    run = lambda z0, ab: dj.fixed_point(
        lambda z, ab: ab[0] @ z + ab[1], z0, ab, solver=solver, batched=False
    )
    sol = jax.jit(run)(jnp.zeros(d, dtype), (a, b))
    expected = np.linalg.solve(np.eye(d) - np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert bool(sol.stats.converged)
    np.testing.assert_allclose(sol.value, expected, rtol=100 * tol, atol=100 * tol)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", SOLVERS)
def test_batched_tanh_matches_reference(name, jit, dtype):
    w, x = tanh_problem(jax.random.PRNGKey(2), dtype=dtype)
    z0 = jnp.zeros_like(x)
    tol = 1e-5 if dtype == "float32" else 1e-11
    sol = solve(tanh_cell, z0, (w, x), make_solver(name, tol=tol, max_iter=200), jit)
    chex.assert_shape(sol.value, x.shape)
    chex.assert_shape(sol.stats.nstep, (x.shape[0],))
    assert bool(jnp.all(sol.stats.converged))
    assert not bool(jnp.any(sol.stats.diverged))
    assert float(jnp.max(sol.stats.rel_residual)) <= tol
    expected = reference_fixed_point(np.tanh, z0, (w, x))
    np.testing.assert_allclose(sol.value, expected, atol=20 * tol)


@pytest.mark.parametrize("name", SOLVERS)
def test_pytree_state(name, dtype):
    """A dict state with leaves of different shapes, coupled through one matrix."""
    w, x = tanh_problem(jax.random.PRNGKey(3), batch=4, d=7, dtype=dtype)

    def to_tree(flat):
        return {"a": flat[:, :3], "b": flat[:, 3:].reshape(-1, 2, 2)}

    def from_tree(t):
        return jnp.concatenate([t["a"], t["b"].reshape(-1, 4)], axis=1)

    def f(z, args):
        return to_tree(tanh_cell(from_tree(z), args))

    tol = 1e-5 if dtype == "float32" else 1e-11
    solver = make_solver(name, tol=tol, max_iter=200)
    sol = solve(f, to_tree(jnp.zeros_like(x)), (w, x), solver, jit=True)
    flat = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver)
    chex.assert_trees_all_equal_shapes_and_dtypes(sol.value, to_tree(x))
    np.testing.assert_allclose(from_tree(sol.value), flat.value, atol=10 * tol)


@pytest.mark.parametrize("name", SOLVERS)
def test_per_sample_stopping_is_independent_of_the_batch(name):
    """A converged sample is frozen: its value and nstep do not depend on its neighbours."""
    d = 8
    easy = contractive_matrix(jax.random.PRNGKey(10), d, 0.1)
    hard = contractive_matrix(jax.random.PRNGKey(11), d, 0.95)
    ws = jnp.stack([easy, hard])  # [2, d, d], one matrix per sample
    x = jnp.ones((2, d))
    f = lambda z, args: jnp.tanh(jnp.einsum("bd,bde->be", z, args[0]) + args[1])
    solver = make_solver(name, tol=1e-5, max_iter=300)
    both = dj.fixed_point(f, jnp.zeros((2, d)), (ws, x), solver=solver)
    alone = dj.fixed_point(f, jnp.zeros((1, d)), (ws[:1], x[:1]), solver=solver)
    assert int(both.stats.nstep[0]) < int(both.stats.nstep[1])
    assert int(both.stats.nstep[0]) == int(alone.stats.nstep[0])
    np.testing.assert_allclose(both.value[0], alone.value[0], rtol=1e-6)
    assert bool(jnp.all(both.stats.converged))


@pytest.mark.parametrize("name", SOLVERS)
def test_statistics_describe_the_returned_iterate(name):
    w, x = tanh_problem(jax.random.PRNGKey(4), norm=0.95)
    solver = make_solver(name, tol=1e-12, max_iter=7)  # unreachable in float32
    sol = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver)
    fz = tanh_cell(sol.value, (w, x))
    abs_res = jnp.linalg.norm(fz - sol.value, axis=1)
    np.testing.assert_allclose(sol.stats.abs_residual, abs_res, rtol=1e-5)
    np.testing.assert_allclose(
        sol.stats.rel_residual, abs_res / (jnp.linalg.norm(fz, axis=1) + 1e-8), rtol=1e-5
    )
    assert not bool(jnp.any(sol.stats.converged))
    np.testing.assert_array_equal(sol.stats.nstep, 7)
    chex.assert_shape(sol.stats.trace, (x.shape[0], 7))
    # The returned residual is the lowest one in the trace.
    np.testing.assert_allclose(jnp.min(sol.stats.trace, axis=1), sol.stats.rel_residual)


def test_trace_is_filled_after_stopping():
    w, x = tanh_problem(jax.random.PRNGKey(5), norm=0.3)
    solver = solvers.anderson(tol=1e-4, max_iter=30)
    sol = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver)
    n = np.asarray(sol.stats.nstep)
    trace = np.asarray(sol.stats.trace)
    for b in range(x.shape[0]):
        assert trace[b, n[b] - 1] <= 1e-4
        np.testing.assert_array_equal(trace[b, n[b] :], sol.stats.rel_residual[b])
        assert np.all(trace[b, : n[b] - 1] > 1e-4)


@pytest.mark.parametrize("name", SOLVERS)
def test_diverging_cell_stops_and_returns_a_finite_iterate(name):
    f = lambda z, _: 3.0 * z + 1.0  # repelling fixed point at -0.5: iterates blow up
    solver = make_solver(name, tol=1e-6, max_iter=400)
    sol = jax.jit(lambda z0: dj.fixed_point(f, z0, None, solver=solver))(jnp.ones((3, 2)))
    if name == "broyden" or name == "anderson":
        # Secant and extrapolation methods solve an affine equation exactly.
        assert bool(jnp.all(sol.stats.converged | sol.stats.diverged))
    else:
        assert bool(jnp.all(sol.stats.diverged))
        assert not bool(jnp.any(sol.stats.converged))
    chex.assert_tree_all_finite(sol.value)


@pytest.mark.parametrize("name", SOLVERS)
def test_nan_input_sets_diverged_inside_jit(name):
    w, x = tanh_problem(jax.random.PRNGKey(6), batch=4)
    x = x.at[1, 3].set(jnp.nan)
    z0 = jnp.zeros_like(x)
    run = jax.jit(lambda z0, args: dj.fixed_point(tanh_cell, z0, args, solver=make_solver(name)))
    sol = run(z0, (w, x))
    np.testing.assert_array_equal(sol.stats.diverged, [False, True, False, False])
    np.testing.assert_array_equal(sol.stats.converged, [True, False, True, True])
    chex.assert_tree_all_finite(sol.value)
    np.testing.assert_array_equal(sol.value[1], z0[1])
    assert np.isinf(float(sol.stats.abs_residual[1]))


@pytest.mark.parametrize("loop", ["scan", "python"])
@pytest.mark.parametrize("name", SOLVERS)
def test_loops_agree(name, loop):
    w, x = tanh_problem(jax.random.PRNGKey(7), batch=4)
    solver = make_solver(name, tol=1e-5, max_iter=40)
    fn = lambda z: tanh_cell(z, (w, x))
    z_while, s_while = solvers.iterate(solver, fn, jnp.zeros_like(x), loop="while")
    z_other, s_other = solvers.iterate(solver, fn, jnp.zeros_like(x), loop=loop)
    np.testing.assert_allclose(z_other, z_while, atol=1e-6)
    np.testing.assert_array_equal(s_other.nstep, s_while.nstep)


def test_unknown_loop():
    with pytest.raises(ValueError, match="Valid loops: while, scan, python"):
        solvers.iterate(solvers.anderson(), lambda z: z, jnp.zeros((1, 2)), loop="for")


def test_vmap_over_problems():
    """vmap over independent problems (each itself a batch) equals solving each one."""
    keys = jax.random.split(jax.random.PRNGKey(8), 3)
    ws, xs = jax.vmap(lambda k: tanh_problem(k, batch=2, d=5))(keys)
    solver = solvers.anderson(tol=1e-6, max_iter=60)
    run = jax.jit(lambda w, x: dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver))
    batched = jax.vmap(run)(ws, xs)
    for i in range(3):
        single = run(ws[i], xs[i])
        np.testing.assert_allclose(batched.value[i], single.value, atol=1e-6)


def test_solver_is_a_static_jit_argument():
    w, x = tanh_problem(jax.random.PRNGKey(9))

    @functools.partial(jax.jit, static_argnames="solver")
    def run(w, x, solver):
        return dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver).value

    a = run(w, x, solver=solvers.anderson(m=3))
    b = run(w, x, solver=solvers.anderson(m=3))
    np.testing.assert_array_equal(a, b)
    assert hash(solvers.anderson(m=3)) == hash(solvers.anderson(m=3))
    assert solvers.anderson(m=3) != solvers.anderson(m=4)


# --- Kernels ---------------------------------------------------------------------------


def gram_of(gs):
    return jnp.einsum("bid,bjd->bij", gs, gs)


def test_anderson_weights_solve_the_constrained_least_squares(x64):
    rng = np.random.default_rng(0)
    gs = rng.normal(size=(3, 4, 10))
    valid = np.array([True, True, True, False])
    gram = gram_of(jnp.asarray(gs)).at[:, 3, :].set(7.0)  # junk in the invalid slot
    alpha = np.asarray(solvers.anderson_weights(gram, jnp.asarray(valid), lam=0.0))
    np.testing.assert_allclose(alpha.sum(1), 1.0)
    np.testing.assert_array_equal(alpha[:, 3], 0.0)
    for b in range(3):
        g = gs[b, :3]  # min ||a^T g|| s.t. sum a = 1, via the KKT system
        kkt = np.block([[2 * g @ g.T, np.ones((3, 1))], [np.ones((1, 3)), np.zeros((1, 1))]])
        expected = np.linalg.solve(kkt, np.r_[np.zeros(3), 1.0])[:3]
        np.testing.assert_allclose(alpha[b, :3], expected, rtol=1e-8, atol=1e-10)


def test_anderson_weights_are_scale_free(x64):
    gs = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 6)))
    valid = jnp.ones(3, bool)
    a = solvers.anderson_weights(gram_of(gs), valid, lam=1e-3)
    b = solvers.anderson_weights(gram_of(1e-9 * gs), valid, lam=1e-3)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_anderson_weights_of_a_zero_residual_are_finite():
    alpha = solvers.anderson_weights(jnp.zeros((2, 3, 3)), jnp.ones(3, bool), lam=1e-4)
    np.testing.assert_allclose(alpha, 1.0 / 3.0, rtol=1e-6)


def test_anderson_step_mixes_images_and_iterates():
    xs = jnp.arange(12.0).reshape(1, 2, 6)
    fs = xs + jnp.array([1.0, 3.0])[None, :, None]
    alpha = jnp.array([[0.25, 0.75]])
    z = solvers.anderson_step(fs, fs - xs, alpha, beta=0.5)
    expected = 0.5 * (0.25 * fs[0, 0] + 0.75 * fs[0, 1]) + 0.5 * (0.25 * xs[0, 0] + 0.75 * xs[0, 1])
    np.testing.assert_allclose(z[0], expected, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_spd_solve_matches_lu(n, x64):
    a = jnp.asarray(np.random.default_rng(n).normal(size=(4, n, n + 3)))
    h = a @ jnp.swapaxes(a, 1, 2) + 0.1 * jnp.eye(n)
    rhs = jnp.asarray(np.random.default_rng(n + 1).normal(size=(4, n)))
    expected = jnp.linalg.solve(h, rhs[..., None])[..., 0]
    np.testing.assert_allclose(solvers.spd_solve(h, rhs), expected, rtol=1e-9, atol=1e-12)


def dense_good_broyden(f, z0, memory, n_evals):
    """Good Broyden with a dense inverse Jacobian per sample, in numpy float64.

    ``H`` starts at ``-I``, restarts at ``-I`` before every ``memory``-th update and takes
    the full step ``-H g``. Returns the iterates ``[B, n_evals, D]``.
    """
    batch, d = z0.shape
    eye = np.broadcast_to(-np.eye(d), (batch, d, d))
    z, g, h = z0, f(z0) - z0, eye.copy()
    iterates = [z]
    z_next = z - np.einsum("bij,bj->bi", h, g)
    for update in range(n_evals - 1):
        z_prev, g_prev, z = z, g, z_next
        iterates.append(z)
        g = f(z) - z
        if update % memory == 0:
            h = eye.copy()
        s, y = z - z_prev, g - g_prev
        v = np.einsum("bi,bij->bj", s, h)  # s^T H
        u = (s - np.einsum("bij,bj->bi", h, y)) / np.sum(v * y, axis=1, keepdims=True)
        h = h + u[:, :, None] * v[:, None, :]
        z_next = z - np.einsum("bij,bj->bi", h, g)
    return np.stack(iterates, axis=1)


def broyden_iterates(solver, f, z0, n_evals):
    """The iterates ``[B, n_evals, D]`` that ``solver`` proposes, one `propose` at a time."""
    z, aux, iterates = z0, solver.init(z0), [z0]
    propose = jax.jit(solver.propose)
    for k in range(1, n_evals):
        z, aux = propose(aux, z, f(z), jnp.asarray(k, jnp.int32))
        iterates.append(z)
    return np.stack(iterates, axis=1), aux


def not_contractive(batch=3, d=6, seed=0):
    """A tanh cell with ||W|| = 1.5 (plain iteration need not converge), numpy and jax."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w = 1.5 * w / np.linalg.norm(w, 2)
    x = rng.normal(size=(batch, d))
    return (lambda z: np.tanh(z @ w + x)), (lambda z: jnp.tanh(z @ w + x)), np.zeros((batch, d))


@pytest.mark.parametrize("memory", [1, 2, 3, 5])
def test_broyden_matches_a_dense_reference(memory, x64):
    """Several cycles of the compact limited-memory method equal dense good Broyden."""
    f_np, f_jax, z0 = not_contractive()
    expected = dense_good_broyden(f_np, z0, memory, n_evals=13)
    got, _ = broyden_iterates(solvers.broyden(memory=memory), f_jax, jnp.asarray(z0), 13)
    assert np.max(np.abs(np.diff(expected, axis=1))) > 1e-2  # the iterates do move
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_broyden_whole_budget_never_restarts(x64):
    f_np, f_jax, z0 = not_contractive(seed=1)
    solver = solvers.broyden(memory=None, max_iter=13)
    assert solver.slots == 11  # one update per evaluation after the first two
    assert solver.replace(max_iter=40).slots == 38  # the call's budget sets the memory
    expected = dense_good_broyden(f_np, z0, memory=10**9, n_evals=13)
    got, _ = broyden_iterates(solver, f_jax, jnp.asarray(z0), 13)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("memory", [5, None])
def test_broyden_reads_only_the_live_prefix_of_a_large_memory(memory, x64, monkeypatch):
    """With prefixes of 2, 4, 8, ... slots the iterates are those of the dense method."""
    monkeypatch.setattr(importlib.import_module("deq_jax.solvers.broyden"), "_PREFIX_SLOTS", 2)
    f_np, f_jax, z0 = not_contractive(seed=3)
    solver = solvers.broyden(memory=memory, max_iter=13)
    expected = dense_good_broyden(f_np, z0, memory or 10**9, n_evals=13)
    got, _ = broyden_iterates(solver, f_jax, jnp.asarray(z0), 13)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_broyden_estimate_satisfies_the_secant_condition(x64):
    """After updates 0..3, H y_3 = s_3 (the newest secant pair) and H g_4 = -s_4."""
    _, f_jax, z0 = not_contractive(seed=2)
    z, aux = broyden_iterates(solvers.broyden(memory=8), f_jax, jnp.asarray(z0), 6)
    g = np.stack([f_jax(z[:, i]) - z[:, i] for i in range(6)], axis=1)
    # the next call writes the step s_4 = z_5 - z_4 and the pending terms to slot 4
    aux = aux._replace(
        steps=aux.steps.at[:, 4].set(z[:, 5] - z[:, 4]),
        weight=aux.weight.at[:, 4].set(aux.next_weight),
        tri=aux.tri.at[:, 4].set(aux.next_row),
    )
    h_y3 = solvers.inv_jacobian_matvec(aux, jnp.asarray(g[:, 4] - g[:, 3]), 4)
    np.testing.assert_allclose(h_y3, z[:, 4] - z[:, 3], rtol=1e-9, atol=1e-12)
    h_g4 = solvers.inv_jacobian_matvec(aux, jnp.asarray(g[:, 4]), 4)
    np.testing.assert_allclose(h_g4, z[:, 4] - z[:, 5], rtol=1e-9, atol=1e-12)


def test_broyden_whole_budget_solves_a_non_contractive_cell():
    """||W|| = 3: plain iteration fails; Broyden with its whole budget as memory solves
    every sample, in fewer evaluations than with a memory of 20."""
    w, x = tanh_problem(jax.random.PRNGKey(13), batch=8, d=32, norm=3.0)

    def run(solver):
        sol = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, 0.5 * x), solver=solver)
        return sol.stats

    hyper = dict(tol=1e-5, max_iter=200)
    assert float(jnp.mean(run(solvers.fixed_point_iteration(**hyper)).converged)) < 0.5
    whole = run(solvers.broyden(memory=None, **hyper))
    limited = run(solvers.broyden(memory=20, **hyper))
    assert bool(jnp.all(whole.converged))
    assert float(jnp.mean(whole.nstep)) < float(jnp.mean(limited.nstep))


def test_broyden_step_skips_a_degenerate_update():
    """A zero step (the first call) makes no update: the step is -H g = g from H = -I."""
    solver = solvers.broyden(memory=4)
    g = jnp.arange(1.0, 9.0).reshape(2, 4)
    state = solver.init(jnp.zeros((2, 4)))
    zero = jnp.zeros((2, 4))
    step, weight, row, u0 = solvers.broyden_step(state, zero, g, g, jnp.asarray(2))
    np.testing.assert_array_equal(step, g)
    np.testing.assert_array_equal(weight, 0.0)
    np.testing.assert_array_equal(u0, 0.0)
    np.testing.assert_array_equal(row, jnp.zeros((2, 4)).at[:, 2].set(1.0))


def test_broyden_restarts_when_its_memory_is_full():
    """Many more steps than memory slots: the restarted method stays stable."""
    w, x = tanh_problem(jax.random.PRNGKey(12), batch=16, d=32, norm=0.99)
    sym = 0.99 * (w + w.T) / jnp.linalg.norm(w + w.T, 2)
    sol = dj.fixed_point(
        tanh_cell,
        jnp.zeros_like(x),
        (sym, 0.2 * x),
        solver=solvers.broyden(memory=3, tol=1e-6, max_iter=300),
    )
    assert int(jnp.max(sol.stats.nstep)) > 3 * 3
    assert bool(jnp.all(sol.stats.converged))
    assert not bool(jnp.any(sol.stats.diverged))


def test_damped_step():
    np.testing.assert_allclose(solvers.damped_step(jnp.zeros(2), jnp.ones(2), 0.3), 0.3)


# --- Registry and hyper-parameters -------------------------------------------------------


def test_registry_builds_by_name():
    assert solvers.get("anderson", m=3, tol=1e-3) == solvers.anderson(m=3, tol=1e-3)
    assert set(solvers.names()) >= {"fixed_point_iteration", "anderson", "broyden"}
    assert solvers.anderson().name == "anderson"


def test_unknown_solver_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="anderson, broyden, fallback, fixed_point_iteration"):
        solvers.get("newton")


def test_unknown_solver_keyword_lists_the_valid_ones():
    with pytest.raises(
        ValueError,
        match=r"'memory'.*Valid keywords: tol, max_iter, stop_mode, full_budget, floor, m",
    ):
        solvers.get("anderson", memory=3)


@pytest.mark.parametrize(
    "name, hyper, message",
    [
        ("anderson", dict(tol=0.0), "tol must be positive"),
        ("anderson", dict(max_iter=0), "max_iter must be an integer >= 1"),
        ("anderson", dict(stop_mode="l2"), "stop_mode must be one of abs, rel"),
        ("anderson", dict(m=0), "m must be an integer >= 1"),
        ("anderson", dict(beta=1.5), "beta must lie in"),
        ("broyden", dict(memory=0), "memory must be an integer >= 1 or None"),
        ("fixed_point_iteration", dict(tau=0.0), "tau must lie in"),
    ],
)
def test_bad_hyper_parameters(name, hyper, message):
    with pytest.raises(ValueError, match=message):
        solvers.get(name, **hyper)


def test_register_a_custom_solver():
    import dataclasses

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class halfway(solvers.Solver):  # noqa: N801
        def init(self, z0):
            return ()

        def propose(self, aux, z, fz, k):
            return 0.5 * (z + fz), aux

    solvers.register("halfway_test", halfway)
    with pytest.raises(ValueError, match="already registered"):
        solvers.register("halfway_test", halfway)
    sol = dj.fixed_point(
        lambda z, _: jnp.cos(z), jnp.array(1.0), None, solver=solvers.get("halfway_test", tol=1e-6)
    )
    np.testing.assert_allclose(float(sol.value), COS_FIXED_POINT, atol=1e-5)
