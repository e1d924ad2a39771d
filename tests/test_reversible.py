"""Reversible DEQs (`deq_jax.solvers.reversible`, `deq_jax.backward.reversible`).

The gradient must be autodiff's through the same steps (stored states, per-sample
stopping included) to float32 rounding and to 1e-10 in float64, on the tanh cell, the
language model's cell and an MDEQ cell; the backward pass's memory must not grow with
the steps while backprop's does.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deq_jax as dj
from configs import default
from deq_jax.backward import reversible as reversible_mode
from deq_jax.nn import DEQ, DEQSpec
from deq_jax.solvers import reversible, reversible_step, reversible_unstep
from deq_jax.training.run import build


def tanh_cell(z, args):
    w, x = args
    return jnp.tanh(z @ w + x)


def _tanh_problem(dtype, batch=4, dim=6, seed=0, rho=0.5):
    """A contractive tanh cell (``W``'s spectral norm ``rho``): undoing a step amplifies
    rounding errors, the less so the more contractive the cell
    (docs/results/reversible.md)."""
    k = jax.random.split(jax.random.key(seed), 2)
    w = jax.random.normal(k[0], (dim, dim), dtype)
    w = rho * w / jnp.linalg.norm(w, 2)
    # samples of different scales converge after different numbers of steps
    scales = jnp.linspace(0.1, 2.0, batch, dtype=dtype)[:, None]
    x = scales * jax.random.normal(k[1], (batch, dim), dtype)
    return (w, x), jnp.zeros((batch, dim), dtype)


def unrolled_reference(f, z0, args, beta, steps):
    """The reversible iteration as plain autodiff-able code: sample ``b`` takes
    ``steps[b]`` steps and returns where it ended; every state is kept (a Python loop),
    on pytree states."""
    tmap = jax.tree_util.tree_map
    prev, z, fz = z0, z0, f(z0, args)
    for k in range(int(np.max(steps))):
        new = tmap(lambda p, fx: reversible_step(p, fx, beta), prev, fz)
        f_new = f(new, args)
        live = jnp.asarray(steps) > k

        def keep(a, b, live=live):
            return jnp.where(live.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

        prev, z, fz = tmap(keep, z, prev), tmap(keep, new, z), tmap(keep, f_new, fz)
    return z


def _loss(z):
    return sum(jnp.sum(jnp.sin(leaf) * (1.0 + i)) for i, leaf in enumerate(jax.tree.leaves(z)))


def _float(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _exact_and_reference(f, z0, args, solver):
    """The value and gradient (w.r.t. the float leaves of ``args``) of a loss of the
    reversible solve, and of the same loss of `unrolled_reference` taking the steps the
    solve took (each sample's evaluations less the first, and less the failed one of a
    diverged sample)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    floats = [x for x in leaves if _float(x)]

    def full(fl):
        it = iter(fl)
        return jax.tree_util.tree_unflatten(treedef, [next(it) if _float(x) else x for x in leaves])

    def exact(fl):
        sol = dj.fixed_point(f, z0, full(fl), solver=solver, backward=reversible_mode())
        return _loss(sol.value), sol.stats

    (value, stats), grads = jax.value_and_grad(exact, has_aux=True)(floats)
    steps = np.asarray(stats.nstep) - 1 - np.asarray(stats.diverged)
    ref = lambda fl: _loss(unrolled_reference(f, z0, full(fl), solver.beta, steps))
    ref_value, ref_grads = jax.value_and_grad(ref)(floats)
    return (value, grads), (ref_value, ref_grads), stats


def _assert_trees_close(a, b, rtol, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# --- the solver --------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 1.0, 2.0, -0.5, 2.5])
def test_beta_outside_the_invertible_range_is_refused(beta):
    with pytest.raises(ValueError, match="beta must lie in"):
        reversible(beta=beta)


def test_registries_know_the_reversible_solver_and_backward():
    assert dj.solvers.get("reversible", beta=0.5).beta == 0.5
    assert isinstance(dj.backward.get("reversible"), reversible_mode)
    with pytest.raises(ValueError, match="Valid keywords"):
        dj.solvers.get("reversible", m=3)


def test_step_and_unstep_invert_each_other():
    k = jax.random.split(jax.random.key(0), 3)
    prev, f_cur = jax.random.normal(k[0], (3, 5)), jax.random.normal(k[1], (3, 5))
    for beta in (0.3, 0.8, 1.5):
        nxt = reversible_step(prev, f_cur, beta)
        np.testing.assert_allclose(reversible_unstep(nxt, f_cur, beta), prev, rtol=1e-5, atol=1e-6)


def test_iterates_are_the_papers_coupled_y_z_sequence(x64):
    """Every second point of the one-sequence form is the paper's ``z_n``, every other
    its ``y_n`` (y_{n+1} = (1-b) y_n + b f(z_n), z_{n+1} = (1-b) z_n + b f(y_{n+1}))."""
    args, z0 = _tanh_problem(jnp.float64)
    beta, steps = 0.7, 9
    solver = reversible(beta=beta, max_iter=steps)
    fn = lambda z: tanh_cell(z, args)
    points = dj.solvers.iterate_observed(solver, fn, z0, steps, lambda z, fz: z)  # [B, 9, D]
    y, z = z0, z0
    for n in range(1, 5):
        y = (1 - beta) * y + beta * fn(z)
        z = (1 - beta) * z + beta * fn(y)
        np.testing.assert_allclose(points[:, 2 * n - 1], y, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(points[:, 2 * n], z, rtol=1e-13, atol=1e-13)


def test_the_solver_converges_with_any_backward_mode():
    args, z0 = _tanh_problem(jnp.float32)
    solver = reversible(beta=0.8, tol=1e-4, max_iter=60)
    for backward in (dj.backward.ift(), dj.backward.unrolled(), reversible_mode()):
        sol = dj.fixed_point(tanh_cell, z0, args, solver=solver, backward=backward)
        assert bool(jnp.all(sol.stats.converged)), backward
        np.testing.assert_allclose(sol.value, tanh_cell(sol.value, args), atol=1e-3)


# --- the exact gradient ------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.5, 0.8, 1.3])
def test_gradient_is_autodiff_through_the_same_steps_in_float64(x64, beta):
    args, z0 = _tanh_problem(jnp.float64)
    solver = reversible(beta=beta, tol=2e-3, max_iter=25)
    (value, grads), (ref_value, ref_grads), stats = _exact_and_reference(
        tanh_cell, z0, args, solver
    )
    assert len(set(np.asarray(stats.nstep).tolist())) > 1  # samples stopped apart
    np.testing.assert_allclose(value, ref_value, rtol=1e-13)
    _assert_trees_close(grads, ref_grads, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("full_budget", [False, True])
def test_gradient_is_autodiff_through_the_same_steps_in_float32(full_budget):
    args, z0 = _tanh_problem(jnp.float32)
    solver = reversible(beta=0.8, tol=1e-4, max_iter=12, full_budget=full_budget)
    (value, grads), (ref_value, ref_grads), stats = _exact_and_reference(
        tanh_cell, z0, args, solver
    )
    if full_budget:
        assert np.all(np.asarray(stats.nstep) == 12)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        assert float(jnp.linalg.norm(g - r) / jnp.linalg.norm(r)) < 1e-5


def test_gradient_on_a_pytree_state(x64):
    def cell(z, args):
        w, x = args
        a, b = z
        return jnp.tanh(b @ w + x), 0.5 * jnp.tanh(a) + 0.1 * x

    args, z0 = _tanh_problem(jnp.float64)
    z0 = (z0, jnp.zeros_like(z0))
    solver = reversible(beta=0.6, tol=1e-7, max_iter=20)
    (value, grads), (ref_value, ref_grads), _ = _exact_and_reference(cell, z0, args, solver)
    np.testing.assert_allclose(value, ref_value, rtol=1e-13)
    _assert_trees_close(grads, ref_grads, rtol=1e-10, atol=1e-12)


def test_a_diverging_sample_stops_at_its_last_finite_point(x64):
    """A sample whose cell turns non-finite is flagged, returned at its last finite
    point, and differentiated through the steps that led there."""

    def cell(z, args):
        a, x = args
        out = a * z + x  # |a| > 1: grows without bound
        return jnp.where(jnp.abs(out) > 50.0, jnp.nan, out)

    a = jnp.asarray([[0.3], [3.0]])
    args = (a, jnp.ones((2, 3)))
    z0 = jnp.zeros((2, 3))
    solver = reversible(beta=0.8, tol=1e-9, max_iter=30)
    (value, grads), (ref_value, ref_grads), stats = _exact_and_reference(cell, z0, args, solver)
    assert stats.diverged.tolist() == [False, True]
    assert bool(jnp.all(jnp.isfinite(grads[0]))) and bool(jnp.all(jnp.isfinite(grads[1])))
    np.testing.assert_allclose(value, ref_value, rtol=1e-13)
    _assert_trees_close(grads, ref_grads, rtol=1e-10, atol=1e-12)


def test_statistics_are_the_other_solvers(x64):
    args, z0 = _tanh_problem(jnp.float64)
    solver = reversible(beta=0.8, tol=1e-6, max_iter=40)
    sol = dj.fixed_point(tanh_cell, z0, args, solver=solver, backward=reversible_mode())
    stats = sol.stats
    fz = tanh_cell(sol.value, args)
    abs_res = jnp.linalg.norm(fz - sol.value, axis=-1)
    np.testing.assert_allclose(stats.abs_residual, abs_res, rtol=1e-12)
    np.testing.assert_allclose(
        stats.rel_residual, abs_res / (jnp.linalg.norm(fz, axis=-1) + 1e-8), rtol=1e-12
    )
    assert bool(jnp.all(stats.converged)) and not bool(jnp.any(stats.diverged))
    assert stats.trace.shape == (4, 40)
    for b, n in enumerate(np.asarray(stats.nstep)):
        assert stats.trace[b, n - 1] <= 1e-6 < stats.trace[b, n - 2]
        np.testing.assert_allclose(stats.trace[b, n:], stats.rel_residual[b])


def test_jit_and_vmap(x64):
    args, z0 = _tanh_problem(jnp.float64, batch=3)
    solver = reversible(beta=0.8, tol=1e-8, max_iter=30)

    def grad_w(w, x):
        loss = lambda w: _loss(
            dj.fixed_point(
                tanh_cell, z0[0], (w, x), solver=solver, backward=reversible_mode(), batched=False
            ).value
        )
        return jax.grad(loss)(w)

    w, xs = args
    batched = jax.jit(jax.vmap(grad_w, in_axes=(None, 0)))(w, xs)
    one_by_one = jnp.stack([grad_w(w, x) for x in xs])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-10, atol=1e-12)


def test_grad_of_grad_is_refused_as_for_ift(x64):
    args, z0 = _tanh_problem(jnp.float64)
    solver = reversible(beta=0.8, tol=1e-8, max_iter=10)
    loss = lambda x: _loss(
        dj.fixed_point(tanh_cell, z0, (args[0], x), solver=solver, backward=reversible_mode()).value
    )
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(lambda x: jnp.sum(jax.grad(loss)(x)))(args[1])


# --- memory ------------------------------------------------------------------------


def _temp_bytes(backward, steps):
    args, z0 = _tanh_problem(jnp.float32, batch=8, dim=256)
    solver = reversible(beta=0.8, tol=1e-9, max_iter=steps, full_budget=True)
    loss = lambda a: _loss(dj.fixed_point(tanh_cell, z0, a, solver=solver, backward=backward).value)
    compiled = jax.jit(jax.grad(loss)).lower(args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_flat_in_the_steps_while_backprops_grows():
    steps = (8, 16, 32, 64)
    exact = [_temp_bytes(reversible_mode(), n) for n in steps]
    unrolled = [_temp_bytes(dj.backward.unrolled(), n) for n in steps]
    state = 8 * 256 * 4
    # reversible: the same program whatever the steps (the trace, [B, max_iter], aside)
    assert max(exact) - min(exact) <= 8 * 64 * 4 + 1024, exact
    # backprop stores the states of every step: at least one state per step more
    pairs = zip(unrolled, unrolled[1:], steps, steps[1:], strict=False)
    assert all(b - a >= (m - n) * state for a, b, n, m in pairs), unrolled
    assert unrolled[-1] > 4 * exact[-1]


# --- pairing errors ----------------------------------------------------------------


def test_the_reversible_backward_refuses_another_solver():
    args, z0 = _tanh_problem(jnp.float32)
    with pytest.raises(ValueError, match="cannot undo those of 'anderson'"):
        dj.fixed_point(
            tanh_cell, z0, args, solver=dj.solvers.anderson(), backward=reversible_mode()
        )
    with pytest.raises(ValueError, match="deq.solver.name='reversible'"):
        DEQSpec(solver=dj.solvers.broyden(), backward=reversible_mode())


def test_a_config_pairs_them_and_names_the_mismatch():
    config = default.get_config()
    config.deq.solver.name = "reversible"
    config.deq.solver.reversible.beta = 0.5
    config.deq.backward.name = "reversible"
    spec = build.build_deq_spec(config.deq)
    assert spec.solver.beta == 0.5 and isinstance(spec.backward, reversible_mode)
    config.deq.solver.name = "anderson"
    with pytest.raises(ValueError, match="cannot undo"):
        build.build_deq_spec(config.deq)


# --- the flagship cells ------------------------------------------------------------


def _check_problem(problem, solver, rtol=1e-10):
    """The gradient w.r.t. every float leaf of the problem's arguments (the cell's
    parameters and its input) within ``rtol`` of autodiff's, leaf by leaf in norm."""
    (value, grads), (ref_value, ref_grads), stats = _exact_and_reference(
        problem.f, problem.z0, problem.args, solver
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        assert float(jnp.linalg.norm(g - r)) <= rtol * float(jnp.linalg.norm(r)) + 1e-14
    return stats


def test_language_model_cell_gradient_is_exact(x64):
    from deq_jax.models.language import DEQTransformerCell, Memory

    b, length, m, d, h, dh, di = 2, 5, 4, 8, 2, 4, 16
    k = jax.random.split(jax.random.key(3), 4)
    memory = Memory(
        jax.random.normal(k[0], (b, m, d), jnp.float64),
        0.3 * jax.random.normal(k[1], (b, m, 3 * h * dh), jnp.float64),
        jnp.asarray([m, 2], jnp.int32),
    )
    x = {
        "injection": 0.3 * jax.random.normal(k[2], (b, length, 3 * h * dh), jnp.float64),
        "memory": memory,
    }
    cell = DEQTransformerCell(d, h, dh, di, dropout=0.2, weight_norm=True, dtype=jnp.float64)
    solver = reversible(beta=0.5, tol=1e-12, max_iter=9, full_budget=True)
    deq = DEQ(cell, spec=DEQSpec(solver=solver, backward=reversible_mode()))
    z0 = jnp.zeros((b, length, d), jnp.float64)
    variables = deq.init(jax.random.key(0), x, z0, train=False)
    problem = deq.apply(
        variables, x, z0, train=True, method=DEQ.problem, rngs={"dropout": jax.random.key(5)}
    )
    stats = _check_problem(problem, solver)
    assert np.all(np.asarray(stats.nstep) == 9)


@pytest.mark.slow  # 78 s in CI; the LM cell's test keeps a flagship cell there
def test_mdeq_cell_gradient_is_exact(x64):
    from configs import mdeq_fashion_mnist
    from deq_jax.nn import deq_call

    config = mdeq_fashion_mnist.get_config("smoke")  # two resolutions of 8 channels
    config.deq.solver.name = "reversible"
    config.deq.backward.name = "reversible"
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    x = jax.random.normal(jax.random.key(0), (2, 28, 28, 1), jnp.float64)
    variables = model.init(jax.random.key(1), x, train=False)
    variables = jax.tree.map(lambda v: v.astype(jnp.float64), variables)
    call = deq_call(model, variables, x, max_iter=7)
    solver = reversible(beta=0.8, tol=1e-12, max_iter=7, full_budget=True)
    _check_problem(call.problem, solver)


def test_the_stats_probe_carries_the_steps_undone_and_the_drift(x64):
    """With a stats probe (what the train steps log), the backward statistics are the
    steps undone and the drift of the rebuilt start from z0: rounding-sized here."""
    from deq_jax.backward import read_stats_probe, stats_probe

    args, z0 = _tanh_problem(jnp.float64)
    z0 = z0 + 0.3  # a start that is not 0, so the drift is relative to something
    solver = reversible(beta=0.8, tol=1e-6, max_iter=20)

    def loss(probe):
        sol = dj.fixed_point(
            tanh_cell, z0, args, solver=solver, backward=reversible_mode(), stats_probe=probe
        )
        return _loss(sol.value), sol.stats

    probe_grad, stats = jax.grad(loss, has_aux=True)(stats_probe(jnp.float64))
    read = read_stats_probe(probe_grad)
    assert float(read["nstep_max"]) == float(jnp.max(stats.nstep)) - 1  # steps undone
    assert 0 <= float(read["abs_residual_max"]) < 1e-6  # 20 steps undone in float64
    assert float(read["converged_fraction"]) == 1.0


@pytest.mark.parametrize(
    "module, arg, evals, beta",
    [
        ("lm_shakespeare", "reversible", 9, 0.5),
        ("mdeq_fashion_mnist", "reversible", 5, 0.8),
        ("mdeq_cifar10", "reversible", 5, 0.8),
    ],
)
def test_the_flagship_configs_reversible_variants(module, arg, evals, beta):
    import importlib

    config = importlib.import_module(f"configs.{module}").get_config(arg)
    spec = build.build_deq_spec(config.deq)
    assert isinstance(spec.solver, reversible) and spec.solver.beta == beta
    assert isinstance(spec.backward, reversible_mode)
    assert spec.budget(train=True) == spec.budget(train=False) == evals
    assert config.regularizer.jacobian_weight == 0.0
