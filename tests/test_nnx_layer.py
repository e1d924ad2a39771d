"""`deq_jax.nnx.DEQ` as an NNX module: train and eval, initial states, rng streams,
penalty terms, ``prepare``, batch statistics, NNX's transforms and bad input."""

import flax.linen as nn
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deq_jax as dj
from deq_jax import nnx as dnx

NEVER = dj.solvers.fixed_point_iteration(tol=1e-30, max_iter=50, stop_mode="abs")


def _x(shape=(4, 3), seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _mlp(features=8, in_features=3, **kwargs):
    return dnx.MLPCell(in_features, features, rngs=nnx.Rngs(0), **kwargs)


def test_train_and_eval_budgets_follow_the_mode_or_the_flag():
    model = dnx.DEQ(_mlp(), solver=NEVER, train_max_iter=3, eval_max_iter=7)
    x = _x()
    assert model(x)[1].trace.shape == (4, 3)  # a new module trains
    model.eval()
    assert model.deterministic and model(x)[1].trace.shape == (4, 7)
    assert bool(jnp.all(model(x, train=True)[1].nstep == 3))
    assert bool(jnp.all(model(x, max_iter=2)[1].nstep == 2))
    model.train()
    assert bool(jnp.all(model(x)[1].nstep == 3))
    assert bool(jnp.all(model(x, train=False)[1].nstep == 7))


@pytest.mark.parametrize("train, max_iter, budget", [(True, None, 3), (False, 2, 2)])
def test_a_call_solves_the_problem_it_states(train, max_iter, budget):
    model = dnx.DEQ(_mlp(), solver=NEVER, train_max_iter=3, z_init="normal", rngs=nnx.Rngs(4))
    x = _x()
    problem = nnx.clone(model).problem(x, train=train, max_iter=max_iter)
    assert problem.solver == NEVER.replace(max_iter=budget) == model.solver_for(train, max_iter)
    z, stats = model(x, train=train, max_iter=max_iter)
    sol = dj.fixed_point(problem.f, problem.z0, problem.args, solver=problem.solver)
    np.testing.assert_array_equal(z, sol.value)
    np.testing.assert_array_equal(stats.nstep, sol.stats.nstep)


def test_initial_states_and_their_rng_stream():
    x = _x((6, 3))
    for z_init in ("normal", "mixed"):
        model = dnx.DEQ(_mlp(), z_init=z_init, rngs=nnx.Rngs(z0=3))
        a, b = model.problem(x).z0, model.problem(x).z0
        assert a.shape == (6, 8) and not np.allclose(a, b)  # a fresh draw per call
        zero_rows = np.all(np.asarray(a) == 0, axis=1)
        assert zero_rows.sum() == (3 if z_init == "mixed" else 0)
    with pytest.raises(ValueError, match="'z0' rng stream"):
        dnx.DEQ(_mlp(), z_init="normal")(x)
    start = lambda x: jnp.full((x.shape[0], 8), 0.25)
    np.testing.assert_array_equal(dnx.DEQ(_mlp(), z_init=start).problem(x).z0, start(x))
    z0 = jnp.ones((6, 8))
    np.testing.assert_array_equal(dnx.DEQ(_mlp()).problem(x, z0).z0, z0)
    with pytest.raises(ValueError, match="z0 must match"):
        dnx.DEQ(_mlp())(x, jnp.zeros((6, 5)))


def test_penalty_terms_are_sown_as_intermediates():
    terms = (dj.regularizers.JacobianTerm(samples=2), dj.regularizers.Alignment())
    model = dnx.DEQ(_mlp(), solver=dj.solvers.anderson(tol=1e-6), terms=terms, rngs=nnx.Rngs(2))
    x = _x()
    twin = nnx.clone(model)
    _, sown = nnx.capture(model, nnx.Intermediate)(x)
    assert set(sown) == {"jacobian_term", "alignment_term"}
    assert not nnx.state(model, nnx.Intermediate)  # nothing left on the model
    # the values are evaluate_terms' at the call's problem, with the keys the call draws
    problem = twin.problem(x)
    solve = lambda z0: dj.fixed_point(problem.f, z0, problem.args, solver=problem.solver).value
    key = lambda stream: getattr(twin.rngs, stream)()
    z_star = solve(problem.z0)
    expected = dj.regularizers.evaluate_terms(terms, problem.f, z_star, problem.args, key, solve)
    for name, value in expected.items():
        (got,) = sown[name].get_value()
        assert got.shape == (4,)
        np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="JacobianTerm draw.* 'jacobian' rng stream"):
        dnx.DEQ(_mlp(), terms=terms[:1])(x)


def test_penalty_gradients_reach_the_parameters():
    terms = (dj.regularizers.JacobianTerm(),)
    model = dnx.DEQ(_mlp(), terms=terms, rngs=nnx.Rngs(0))

    @nnx.jit
    def grads(model, x):
        def loss(model):
            _, sown = nnx.capture(model, nnx.Intermediate)(x)
            (value,) = sown["jacobian_term"].get_value()
            return jnp.mean(value)

        return nnx.grad(loss)(model)

    g = grads(model, _x())
    assert float(jnp.abs(g["cell"]["recurrent"]["kernel"][...]).sum()) > 0


class _MaskCell(nnx.Module):
    """``z' = z / 2 + drop(1)``: its fixed point is ``2 * mask`` only if the mask is fixed."""

    def __init__(self):
        self.drop = dnx.VariationalDropout(0.5)

    def __call__(self, z, x):
        return 0.5 * z + self.drop(jnp.ones_like(z)) + 0.0 * x


def test_dropout_mask_is_fixed_within_a_solve_and_fresh_across_calls():
    solver = dj.solvers.fixed_point_iteration(tol=1e-6, max_iter=60, stop_mode="abs")
    model = dnx.DEQ(_MaskCell(), solver=solver, rngs=nnx.Rngs(dropout=1))
    x = _x((8, 16))
    (z1, s1), (z2, s2) = model(x), model(x)
    for z, stats in ((z1, s1), (z2, s2)):
        assert bool(jnp.all(stats.converged))  # a changing mask would never converge
        kept, dropped = np.isclose(z, 4.0, atol=1e-4), np.isclose(z, 0.0, atol=1e-4)
        assert np.all(kept | dropped) and 0.3 < kept.mean() < 0.7
    assert not np.allclose(z1, z2)
    model.eval()
    np.testing.assert_allclose(model(x)[0], 2.0, atol=1e-4)
    no_stream = dnx.DEQ(_MaskCell(), solver=solver, rngs=nnx.Rngs(z0=1))
    np.testing.assert_allclose(no_stream(x)[0], 2.0, atol=1e-4)  # no dropout stream


def test_standalone_variational_dropout():
    layer = dnx.VariationalDropout(0.25, broadcast_dims=(1,))
    x = jnp.ones((64, 10, 32))
    np.testing.assert_array_equal(layer(x), x)  # no key: the identity
    y = layer(x, key=jax.random.key(0))
    np.testing.assert_array_equal(y, y[:, :1].repeat(10, axis=1))  # shared along axis 1
    assert abs(float(jnp.mean(y == 0)) - 0.25) < 0.05
    np.testing.assert_array_equal(layer(x, key=jax.random.key(0), deterministic=True), x)
    np.testing.assert_array_equal(layer(x, key=jax.random.key(0)), y)  # the key decides
    with pytest.raises(ValueError, match="rate"):
        dnx.VariationalDropout(1.0)


class _PreparedCell(nnx.Module):
    """``z -> tanh(W z + cosh(x))``: ``cosh(x)`` is its state-independent part."""

    def __init__(self, rngs):
        self.w = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, z, x):
        if not isinstance(x, dict):
            x = self.prepare(x)
        return jnp.tanh(self.w(z) + x["c"])

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
    model = dnx.DEQ(_PreparedCell(nnx.Rngs(0)), solver=dj.solvers.anderson(tol=1e-8))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    graphdef, state = nnx.split(model)

    def loss(state):
        return jnp.sum(nnx.merge(graphdef, state)(x)[0] ** 2)

    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(state).jaxpr
    bodies = list(_while_bodies(jaxpr))
    assert bodies and all("cosh" not in _primitives(body) for body in bodies)
    assert "cosh" in _primitives(jaxpr)
    z_star, _ = model(x)  # the prepared solve is the unprepared cell's fixed point
    np.testing.assert_allclose(model.cell(z_star, x), z_star, atol=1e-6)


class _LinenSpectralCell(nn.Module):
    def setup(self):
        self.sn = dj.nn.SpectralNorm(nn.Dense(4))

    def __call__(self, z, x):
        return jnp.tanh(self.sn(z) + x)


class _SpectralCell(nnx.Module):
    def __init__(self, rngs):
        linear = nnx.Linear(4, 4, param_dtype=jnp.float64, rngs=rngs)
        self.sn = dnx.SpectralNorm(linear, param_dtype=jnp.float64, rngs=rngs)

    def __call__(self, z, x):
        return jnp.tanh(self.sn(z) + x)


def test_batch_stats_advance_once_per_training_call_as_linen(x64):
    solver = dj.solvers.anderson(tol=1e-12, max_iter=60)
    x = _x((3, 4), dtype=jnp.float64)
    linen = dj.nn.DEQ(_LinenSpectralCell(), solver=solver)
    variables = linen.init(jax.random.key(0), x, train=False)
    variables = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), variables)
    cell = _SpectralCell(nnx.Rngs(0))
    model = dnx.from_linen(dnx.DEQ(cell, solver=solver), variables)
    before = dnx.to_linen(model)["batch_stats"]
    for _ in range(2):  # two training calls: u advances twice, as linen's
        (z_l, stats_l), updates = linen.apply(variables, x, train=True, mutable=["batch_stats"])
        variables = {**variables, **updates}
        z_n, stats_n = model(x)
        np.testing.assert_allclose(z_n, z_l, rtol=0, atol=1e-10)
        assert bool(jnp.all(stats_n.converged))  # the same map at every iteration
        stats = dnx.to_linen(model)["batch_stats"]
        jax.tree_util.tree_map(np.testing.assert_array_equal, stats, variables["batch_stats"])
    u = "layer_instance/kernel/u"
    assert not np.allclose(before["cell"]["sn"][u], stats["cell"]["sn"][u])
    model.eval()
    model(x)
    jax.tree_util.tree_map(np.testing.assert_array_equal, dnx.to_linen(model)["batch_stats"], stats)


def test_under_nnx_jit_grad_and_vmap():
    model = dnx.DEQ(_mlp(), solver=dj.solvers.anderson(tol=1e-6), backward=dj.backward.ift())
    x = _x((2, 4, 3))

    def loss(model, x):
        return jnp.sum(model(x)[0] ** 2)

    value, grads = nnx.jit(nnx.value_and_grad(loss))(model, x[1])
    graphdef, state = nnx.split(model)  # the same loss as a pure function of the state
    pure = jax.jit(jax.value_and_grad(lambda s, x: loss(nnx.merge(graphdef, s), x)))
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    jax.tree_util.tree_map(close, (value, grads), pure(state, x[1]))
    batched = nnx.jit(nnx.vmap(nnx.value_and_grad(loss), in_axes=(None, 0)))(model, x)
    kernel = batched[1]["cell"]["recurrent"]["kernel"][...]
    assert kernel.shape == (2, 8, 8)
    close(batched[0][1], value)
    close(kernel[1], grads["cell"]["recurrent"]["kernel"][...])


def test_stats_probe_carries_the_backward_solves_statistics():
    model = dnx.DEQ(_mlp(), solver=dj.solvers.anderson(tol=1e-5))
    loss = lambda model, probe: jnp.sum(model(_x(), stats_probe=probe)[0])
    _, g_probe = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(model, dj.backward.stats_probe())
    stats = dj.backward.read_stats_probe(g_probe)
    assert float(stats["converged_fraction"]) == 1.0 and float(stats["nstep_max"]) >= 2


class _WrongShapeCell(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Linear(3, 4, rngs=rngs)

    def __call__(self, z, x):
        return self.w(z)


def test_bad_input_gets_one_clear_error():
    x = _x()
    with pytest.raises(ValueError, match=r"must return a pytree.*f is the cell"):
        dnx.DEQ(_WrongShapeCell(nnx.Rngs(0)))(x)
    with pytest.raises(TypeError, match="cell must be an nnx.Module"):
        dnx.DEQ(dj.nn.MLPCell(4))
    with pytest.raises(TypeError, match="DEQSpec"):
        dnx.DEQ(_mlp(), spec={"solver": "anderson"})
    with pytest.raises(TypeError, match="rngs must be an nnx.Rngs"):
        dnx.DEQ(_mlp(), rngs=jax.random.key(0))
    with pytest.raises(ValueError, match="z_init"):
        dnx.DEQ(_mlp(), z_init="ones")
    with pytest.raises(ValueError, match="train_max_iter"):
        dnx.DEQ(_mlp(), train_max_iter=0)


class _NNXDropoutCell(nnx.Module):
    def __init__(self, rngs):
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, z, x):
        return 0.5 * self.drop(z) + x


def test_nnx_dropout_in_a_cell_is_refused():
    with pytest.raises(ValueError, match=r"cell\.drop is an nnx\.Dropout.*VariationalDropout"):
        dnx.DEQ(_NNXDropoutCell(nnx.Rngs(0)))
