"""Tests of `deq_jax.nn.DEQ` and `deq_jax.nn.VariationalDropout`."""

import flax.linen as nn
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deq_jax as dj
from deq_jax.nn import DEQ, MLPCell, VariationalDropout, initial_state, state_like


def _x(shape=(4, 3), seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _count(tree):
    return sum(a.size for a in jax.tree_util.tree_leaves(tree))


def test_mlp_deq_shapes_and_parameter_count():
    x = _x()
    model = DEQ(MLPCell(features=8))
    variables = model.init(jax.random.key(0), x, train=False)
    # W [8, 8] + b [8] + U [3, 8] (no bias).
    assert _count(variables["params"]) == 64 + 8 + 24
    z, stats = model.apply(variables, x, train=False)
    assert z.shape == (4, 8) and z.dtype == jnp.float32
    assert isinstance(stats, dj.SolverStats)
    assert stats.nstep.shape == (4,)
    assert stats.trace.shape == (4, model.spec.solver.max_iter)


@pytest.mark.parametrize("jit", [False, True])
def test_fixed_point_satisfies_cell(jit):
    x = _x()
    cell = MLPCell(features=8, hidden=16)
    model = DEQ(cell, solver=dj.solvers.anderson(tol=1e-5, max_iter=60))
    variables = model.init(jax.random.key(0), x, train=False)
    apply = lambda v, x: model.apply(v, x, train=False)
    z, stats = (jax.jit(apply) if jit else apply)(variables, x)
    assert bool(jnp.all(stats.converged))
    fz = cell.apply({"params": variables["params"]["cell"]}, z, x)
    rel = jnp.linalg.norm(fz - z, axis=-1) / jnp.linalg.norm(fz, axis=-1)
    np.testing.assert_array_less(rel, 2e-5)
    np.testing.assert_allclose(rel, stats.rel_residual, atol=2e-6)


def test_jit_matches_eager():
    x = _x()
    model = DEQ(MLPCell(features=8), solver=dj.solvers.broyden(tol=1e-5))
    variables = model.init(jax.random.key(0), x, train=False)
    eager = model.apply(variables, x, train=False)
    jitted = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), eager, jitted)


def _loss_fn(model, x, w):
    def loss(params):
        z, _ = model.apply({"params": params}, x, train=True)
        return jnp.sum(z * w)

    return loss


def test_ift_gradient_matches_finite_differences_and_unrolled(x64):
    x = _x((3, 2), dtype=jnp.float64)
    w = _x((3, 4), seed=2, dtype=jnp.float64)
    solver = dj.solvers.fixed_point_iteration(tol=1e-12, max_iter=100, stop_mode="abs")
    ift = DEQ(MLPCell(features=4), solver=solver, backward=dj.backward.ift())
    params = ift.init(jax.random.key(0), x, train=False)["params"]
    params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float64), params)
    # One jitted loss for the differences and both gradients: its gradient compiles once.
    loss = jax.jit(_loss_fn(ift, x, w))
    check_grads(loss, (params,), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)
    unrolled = DEQ(MLPCell(features=4), solver=solver, backward=dj.backward.unrolled())
    g_ift = jax.grad(loss)(params)
    g_unrolled = jax.jit(jax.grad(_loss_fn(unrolled, x, w)))(params)
    chex_close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    jax.tree_util.tree_map(chex_close, g_ift, g_unrolled)
    # A different answer would show: the gradient is not identically zero.
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(g_ift)) > 1e-2


def test_gradient_reaches_input():
    x = _x()
    model = DEQ(MLPCell(features=8), solver=dj.solvers.anderson(tol=1e-6, max_iter=60))
    variables = model.init(jax.random.key(0), x, train=False)
    gx = jax.jit(jax.grad(lambda x: jnp.sum(model.apply(variables, x, train=False)[0])))(x)
    assert gx.shape == x.shape and float(jnp.max(jnp.abs(gx))) > 0


def test_initial_state_zeros_normal_mixed():
    spec = jax.ShapeDtypeStruct((8, 5), jnp.float32)
    sample = jax.jit(initial_state, static_argnums=(0, 1))
    assert np.all(np.asarray(sample(spec, "zeros", jax.random.key(0))) == 0)
    normal = np.asarray(sample(spec, "normal", jax.random.key(0)))
    assert np.all(normal != 0) and abs(float(np.std(normal)) - 1.0) < 0.3
    zero_counts = np.zeros(8)
    for seed in range(20):
        z = np.asarray(sample(spec, "mixed", jax.random.key(seed)))
        zero_rows = np.all(z == 0, axis=1)
        assert zero_rows.sum() == 4 and np.all(z[~zero_rows] != 0)
        zero_counts += zero_rows
    assert 0 < zero_counts.min() and zero_counts.max() < 20  # zero rows move around
    with pytest.raises(ValueError, match="z_init"):
        initial_state(spec, "ones", None)


def test_mixed_init_odd_batch_and_pytree():
    spec = {"a": jax.ShapeDtypeStruct((5, 2), jnp.float32), "b": state_like(jnp.ones((5, 3)), 4)}
    sample = jax.jit(lambda key: initial_state(spec, "mixed", key))
    counts = set()
    for seed in range(12):
        z = sample(jax.random.key(seed))
        assert z["b"].shape == (5, 4)
        zero_a = np.all(np.asarray(z["a"]) == 0, axis=1)
        zero_b = np.all(np.asarray(z["b"]) == 0, axis=1)
        np.testing.assert_array_equal(zero_a, zero_b)  # per sample, across leaves
        counts.add(int(zero_a.sum()))
    assert counts == {2, 3}


def test_deq_starts_from_z_init():
    x = _x((8, 3))
    model = DEQ(MLPCell(features=6), solver=dj.solvers.fixed_point_iteration(), z_init="mixed")
    variables = model.init(jax.random.key(0), x, train=False)
    # With a budget of one evaluation the returned iterate is the initial state.
    z1, stats = model.apply(variables, x, train=False, max_iter=1, rngs={"z0": jax.random.key(1)})
    z2, _ = model.apply(variables, x, train=True, max_iter=1, rngs={"z0": jax.random.key(2)})
    assert bool(jnp.all(stats.nstep == 1))
    for z in (np.asarray(z1), np.asarray(z2)):
        zero_rows = np.all(z == 0, axis=1)
        assert zero_rows.sum() == 4 and np.all(z[~zero_rows] != 0)
    assert not np.allclose(z1, z2)


def test_normal_init_without_z0_rng_is_an_error():
    x = _x()
    model = DEQ(MLPCell(features=6), z_init="normal")
    variables = model.init(jax.random.key(0), x, train=False)
    with pytest.raises(ValueError, match="'z0' rng"):
        model.apply(variables, x, train=False)


def test_explicit_z0_is_used():
    x = _x()
    model = DEQ(MLPCell(features=6))
    variables = model.init(jax.random.key(0), x, train=False)
    z0 = jnp.full((4, 6), 0.25)
    z, _ = model.apply(variables, x, z0, train=False, max_iter=1)
    np.testing.assert_array_equal(z, z0)


def test_train_and_eval_budgets():
    x = _x()
    never = dj.solvers.fixed_point_iteration(tol=1e-30, max_iter=50, stop_mode="abs")
    model = DEQ(MLPCell(features=8), solver=never, train_max_iter=3, eval_max_iter=7)
    variables = model.init(jax.random.key(0), x, train=False)
    _, train_stats = model.apply(variables, x, train=True)
    _, eval_stats = model.apply(variables, x, train=False)
    _, call_stats = model.apply(variables, x, train=False, max_iter=2)
    assert train_stats.trace.shape == (4, 3) and bool(jnp.all(train_stats.nstep == 3))
    assert eval_stats.trace.shape == (4, 7) and bool(jnp.all(eval_stats.nstep == 7))
    assert bool(jnp.all(call_stats.nstep == 2))
    plain = DEQ(MLPCell(features=8), solver=never.replace(max_iter=4))
    assert bool(jnp.all(plain.apply(variables, x, train=True)[1].nstep == 4))


def test_nan_input_diverges_only_its_sample():
    x = _x().at[1, 0].set(jnp.nan)
    model = DEQ(MLPCell(features=8), solver=dj.solvers.fixed_point_iteration(tol=1e-4))
    variables = model.init(jax.random.key(0), _x(), train=False)
    z, stats = model.apply(variables, x, train=False)
    np.testing.assert_array_equal(stats.diverged, [False, True, False, False])
    np.testing.assert_array_equal(stats.converged, [True, False, True, True])
    assert bool(jnp.all(jnp.isfinite(z)))


_STATE_SPEC_CALLS = []


class _CountedCell(MLPCell):
    """An `MLPCell` that counts the calls of its ``state_spec``."""

    def state_spec(self, x):
        _STATE_SPEC_CALLS.append(x.shape)
        return super().state_spec(x)


def test_a_call_builds_its_initial_state_and_checks_the_cell_once(monkeypatch):
    # One call: the state's spec is read once (to draw z0, or to check an explicit z0)
    # and the cell's output is checked once (one abstract evaluation, by fixed_point).
    x = _x()
    model = DEQ(_CountedCell(features=6), z_init="normal")
    variables = model.init(jax.random.key(0), x, train=False)
    shape_checks = []  # abstract evaluations of the cell as DEQ's pure function f
    eval_shape = jax.eval_shape

    def counted(f, *args, **kwargs):
        if getattr(f, "__qualname__", "").startswith("DEQ."):
            shape_checks.append(f.__qualname__)
        return eval_shape(f, *args, **kwargs)

    monkeypatch.setattr(jax, "eval_shape", counted)
    _STATE_SPEC_CALLS.clear()
    model.apply(variables, x, train=False, rngs={"z0": jax.random.key(1)})
    assert _STATE_SPEC_CALLS == [x.shape] and len(shape_checks) == 1
    _STATE_SPEC_CALLS.clear()
    model.apply(variables, x, jnp.zeros((4, 6)), train=True)
    assert _STATE_SPEC_CALLS == [x.shape] and len(shape_checks) == 2


@pytest.mark.parametrize(
    "train, max_iter, budget", [(True, None, 3), (False, None, 7), (False, 2, 2)]
)
def test_a_call_solves_the_problem_it_states(train, max_iter, budget):
    # DEQ.problem's solver, with the spec's budget, is what the call runs: the same
    # budget, and fixed_point on the problem's pieces gives the call's output bit for bit.
    x = _x()
    never = dj.solvers.fixed_point_iteration(tol=1e-30, max_iter=50, stop_mode="abs")
    model = DEQ(MLPCell(features=8), solver=never, train_max_iter=3, eval_max_iter=7)
    variables = model.init(jax.random.key(0), x, train=False)
    kwargs = dict(train=train, max_iter=max_iter)
    problem = model.apply(variables, x, method=DEQ.problem, **kwargs)
    assert problem.solver == never.replace(max_iter=budget) == model.solver_for(train, max_iter)
    z, stats = model.apply(variables, x, **kwargs)
    assert stats.trace.shape == (4, budget) and bool(jnp.all(stats.nstep == budget))
    sol = dj.fixed_point(problem.f, problem.z0, problem.args, solver=problem.solver)
    np.testing.assert_array_equal(z, sol.value)
    np.testing.assert_array_equal(stats.nstep, sol.stats.nstep)


class _CappedDEQ(DEQ):
    """A `DEQ` whose solves stop after 5 evaluations, whatever its spec says."""

    def solver_for(self, train, max_iter=None):
        return super().solver_for(train, max_iter).replace(max_iter=5)


def test_the_solver_for_a_call_is_the_one_it_runs():
    x = _x()
    never = dj.solvers.fixed_point_iteration(tol=1e-30, max_iter=50, stop_mode="abs")
    model = _CappedDEQ(MLPCell(features=8), solver=never, eval_max_iter=9)
    variables = model.init(jax.random.key(0), x, train=False)
    _, stats = model.apply(variables, x, train=False)
    assert stats.trace.shape == (4, 5) and bool(jnp.all(stats.nstep == 5))


class _WrongShapeCell(nn.Module):
    @nn.compact
    def __call__(self, z, x):
        return nn.Dense(z.shape[-1] + 1)(z)


def test_wrong_cell_output_is_a_value_error():
    x = _x()
    with pytest.raises(ValueError, match=r"must return a pytree.*f is the cell"):
        DEQ(_WrongShapeCell()).init(jax.random.key(0), x, train=False)


def test_wrong_z0_shape_is_a_value_error():
    x = _x()
    model = DEQ(MLPCell(features=6))
    variables = model.init(jax.random.key(0), x, train=False)
    with pytest.raises(ValueError, match="z0 must match"):
        model.apply(variables, x, jnp.zeros((4, 5)), train=False)
    with pytest.raises(ValueError, match="z0 must match"):
        model.apply(variables, x, jnp.zeros((4, 6), jnp.int32), train=False)


def test_bad_configuration():
    with pytest.raises(ValueError, match="z_init"):
        DEQ(MLPCell(4), z_init="ones")
    with pytest.raises(TypeError, match="Solver"):
        DEQ(MLPCell(4), solver="anderson")
    with pytest.raises(TypeError, match="backward"):
        DEQ(MLPCell(4), backward="ift")
    with pytest.raises(ValueError, match="train_max_iter"):
        DEQ(MLPCell(4), train_max_iter=0)


class _MaskCell(nn.Module):
    """``z' = z / 2 + drop(1)``: its fixed point is ``2 * mask`` only if the mask is fixed."""

    rate: float = 0.5

    @nn.compact
    def __call__(self, z, x):
        return 0.5 * z + VariationalDropout(self.rate)(jnp.ones_like(z)) + 0.0 * x


def _mask_model():
    solver = dj.solvers.fixed_point_iteration(tol=1e-6, max_iter=60, stop_mode="abs")
    return DEQ(_MaskCell(), solver=solver)


def test_dropout_mask_fixed_within_a_solve_and_fresh_across_calls():
    x = _x((8, 16))
    model = _mask_model()
    variables = model.init(jax.random.key(0), x, train=False)
    z1, s1 = model.apply(variables, x, train=True, rngs={"dropout": jax.random.key(1)})
    z2, s2 = model.apply(variables, x, train=True, rngs={"dropout": jax.random.key(2)})
    for z, stats in ((z1, s1), (z2, s2)):
        assert bool(jnp.all(stats.converged))  # a changing mask would never converge
        kept = np.isclose(np.asarray(z), 4.0, atol=1e-4)  # 2 / (1 - rate)
        dropped = np.isclose(np.asarray(z), 0.0, atol=1e-4)
        assert np.all(kept | dropped) and 0.3 < kept.mean() < 0.7
    assert not np.allclose(z1, z2)
    z_eval, _ = model.apply(variables, x, train=False, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_allclose(z_eval, 2.0, atol=1e-4)


def test_dropout_differs_between_two_deq_calls_in_one_apply():
    class Twice(nn.Module):
        @nn.compact
        def __call__(self, x):
            deq = _mask_model()
            return deq(x, train=True)[0], deq(x, train=True)[0]

    x = _x((4, 32))
    variables = Twice().init(jax.random.key(0), x)
    a, b = Twice().apply(variables, x, rngs={"dropout": jax.random.key(3)})
    assert not np.allclose(a, b)


def test_gradient_with_dropout_uses_the_same_mask():
    x = _x()
    solver = dj.solvers.fixed_point_iteration(tol=1e-6, max_iter=100)
    model = DEQ(MLPCell(features=8, dropout_rate=0.3), solver=solver)
    params = model.init(jax.random.key(0), x, train=False)["params"]
    rngs = {"dropout": jax.random.key(5)}

    def loss(p, backward):
        z, _ = model.clone(backward=backward).apply({"params": p}, x, train=True, rngs=rngs)
        return jnp.sum(z**2)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_ift = grad(params, dj.backward.ift())
    g_unrolled = grad(params, dj.backward.unrolled())
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-5)
    jax.tree_util.tree_map(close, g_ift, g_unrolled)


def test_variational_dropout_layer():
    x = jnp.ones((64, 10, 32))
    layer = VariationalDropout(0.25, broadcast_dims=(1,))
    y = layer.apply({}, x, rngs={"dropout": jax.random.key(0)})
    assert set(np.unique(np.asarray(y)).tolist()) <= {0.0, float(np.float32(4.0) / np.float32(3.0))}
    np.testing.assert_array_equal(y, y[:, :1, :].repeat(10, axis=1))  # shared along axis 1
    assert abs(float(jnp.mean(y == 0)) - 0.25) < 0.05
    again = layer.apply({}, x, rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(y, again)
    np.testing.assert_array_equal(layer.apply({}, x), x)  # no rng: deterministic
    explicit = layer.apply({}, x, deterministic=True, rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(explicit, x)
    with pytest.raises(ValueError, match="rate"):
        VariationalDropout(1.0)


def test_stats_probe_through_the_module():
    model = DEQ(MLPCell(features=8), solver=dj.solvers.anderson(tol=1e-5))
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    variables = model.init(jax.random.PRNGKey(1), x, train=False)

    def loss(params, probe):
        z, _ = model.apply({"params": params}, x, train=True, stats_probe=probe)
        return jnp.sum(z)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))  # one program, not each op eagerly
    _, g_probe = grad(variables["params"], dj.backward.stats_probe())
    stats = dj.backward.read_stats_probe(g_probe)
    assert float(stats["converged_fraction"]) == 1.0
    assert float(stats["nstep_max"]) >= 2


class _PreparedCell(nn.Module):
    """``z -> tanh(W z + cosh(x))``: ``cosh(x)`` is its state-independent part."""

    @nn.compact
    def __call__(self, z, x):
        if not isinstance(x, dict):
            x = self.prepare(x)
        return jnp.tanh(nn.Dense(z.shape[-1], name="w")(z) + x["c"])

    def prepare(self, x):
        return {"c": jnp.cosh(x)}


def _while_bodies(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            yield eqn.params["body_jaxpr"].jaxpr
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _while_bodies(sub)


def _primitives(jaxpr):
    names = {eqn.primitive.name for eqn in jaxpr.eqns}
    for eqn in jaxpr.eqns:
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


def test_a_cells_prepare_runs_once_outside_the_solvers_loop():
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    model = DEQ(_PreparedCell(), solver=dj.solvers.anderson(tol=1e-8, max_iter=50))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
    loss = lambda v: jnp.sum(model.apply(v, x, train=False)[0] ** 2)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(variables).jaxpr
    bodies = list(_while_bodies(jaxpr))
    assert bodies and all("cosh" not in _primitives(body) for body in bodies)
    assert "cosh" in _primitives(jaxpr)
    # the prepared solve is the unprepared cell's fixed point, gradients included
    unprepared = lambda v, z: _PreparedCell().apply({"params": v["params"]["cell"]}, z, x)
    z_star, _ = model.apply(variables, x, train=False)
    np.testing.assert_allclose(unprepared(variables, z_star), z_star, atol=1e-6)
    check_grads(loss, (variables,), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)
