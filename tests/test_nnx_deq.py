"""`deq_jax.nnx.DEQ` against `deq_jax.nn.DEQ`: the same weights give the same fixed point,
statistics and gradients (float64, to 1e-10) for every backward mode, a cell with dropout
and a convolutional cell with group norm; and the NNX layer under NNX's transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deq_jax as dj
from deq_jax import nnx as dnx

TOL = 1e-10
F64 = jnp.float64


def _close(a, b, tol=TOL):
    """Every leaf of ``a`` within ``tol`` of ``b`` (same structure); exact for non-floats."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=tol)


def _nnx_grads(model, grads):
    """NNX gradients (an ``nnx.State``) as the linen twin's ``params`` tree."""
    twin = nnx.clone(model)
    nnx.update(twin, grads)
    return dnx.to_linen(twin)["params"]


def _pair(linen_cell, nnx_cell, spec, x, rngs=None):
    """A linen DEQ initialised on ``x`` (float64) and its NNX twin holding its weights."""
    linen = dj.nn.DEQ(linen_cell, spec=spec)
    variables = linen.init(jax.random.key(0), x, train=False)
    variables = jax.tree_util.tree_map(lambda a: a.astype(F64), variables)
    model = dnx.DEQ(nnx_cell, spec, rngs=rngs)
    dnx.from_linen(model, variables)
    return linen, variables, model


def _loss(z, w):
    return jnp.sum(jnp.sin(z) * w)


def _check_call_and_gradients(linen, variables, model, x, w, rngs=None):
    """z*, stats and the gradients w.r.t. the parameters and ``x`` agree."""
    z_l, stats_l = linen.apply(variables, x, train=True, rngs=rngs)
    z_n, stats_n = model(x, train=True)
    _close(z_n, z_l)
    _close(stats_n, stats_l)

    def linen_loss(params, x):
        return _loss(linen.apply({**variables, "params": params}, x, train=True)[0], w)

    def nnx_loss(m, x):
        return _loss(m(x, train=True)[0], w)

    g_l = jax.grad(linen_loss, argnums=(0, 1))(variables["params"], x)
    g_n, gx_n = nnx.grad(nnx_loss, argnums=(0, 1))(model, x)
    _close(_nnx_grads(model, g_n), g_l[0])
    _close(gx_n, g_l[1])


BACKWARDS = {
    "ift": (dj.solvers.anderson(tol=1e-12, max_iter=80), dj.backward.ift()),
    "phantom": (dj.solvers.anderson(tol=1e-12, max_iter=80), dj.backward.phantom(k=4)),
    "jacobian_free": (dj.solvers.broyden(tol=1e-12, max_iter=80), dj.backward.jacobian_free()),
    "unrolled": (dj.solvers.fixed_point_iteration(tol=1e-9, max_iter=40), dj.backward.unrolled()),
    "reversible": (dj.solvers.reversible(tol=1e-9, max_iter=40), dj.backward.reversible()),
}


@pytest.mark.parametrize("mode", list(BACKWARDS))
def test_mlp_deq_equals_the_linen_layer(x64, mode):
    solver, backward = BACKWARDS[mode]
    spec = dj.nn.DEQSpec(solver=solver, backward=backward, train_max_iter=30)
    x = jax.random.normal(jax.random.key(1), (3, 4), F64)
    w = jax.random.normal(jax.random.key(2), (3, 5), F64)
    options = dict(hidden=6, weight_norm=True, param_dtype=F64)
    linen, variables, model = _pair(
        dj.nn.MLPCell(5, **options),
        dnx.MLPCell(4, 5, **options, rngs=nnx.Rngs(0)),
        spec,
        x,
    )
    _check_call_and_gradients(linen, variables, model, x, w)


def test_conv_cell_with_group_norm_equals_the_linen_layer(x64):
    spec = dj.nn.DEQSpec(solver=dj.solvers.anderson(tol=1e-9, max_iter=80))
    x = jax.random.normal(jax.random.key(1), (2, 5, 5, 2), F64)
    w = jax.random.normal(jax.random.key(2), (2, 5, 5, 4), F64)
    options = dict(num_blocks=1, norm="group", norm_groups=2, param_dtype=F64)
    linen, variables, model = _pair(
        dj.nn.Conv2DCell(4, **options),
        dnx.Conv2DCell(2, 4, **options, rngs=nnx.Rngs(0)),
        spec,
        x,
    )
    _check_call_and_gradients(linen, variables, model, x, w)


def test_cell_with_dropout_equals_the_linen_layer(x64):
    """Handed the linen layer's solve key, the NNX cell drops the same units: the same
    fixed point, statistics and gradients; and a call solves the problem it states."""
    spec = dj.nn.DEQSpec(solver=dj.solvers.anderson(tol=1e-12, max_iter=60))
    x = jax.random.normal(jax.random.key(1), (3, 4), F64)
    w = jax.random.normal(jax.random.key(2), (3, 6), F64)
    linen, variables, model = _pair(
        dj.nn.MLPCell(6, dropout_rate=0.3, param_dtype=F64),
        dnx.MLPCell(4, 6, dropout_rate=0.3, param_dtype=F64, rngs=nnx.Rngs(0)),
        spec,
        x,
        rngs=nnx.Rngs(dropout=5),
    )
    rngs = {"dropout": jax.random.key(7)}
    linen_problem = linen.apply(variables, x, train=True, rngs=rngs, method="problem")
    twin = nnx.clone(model)
    problem = model.problem(x, train=True)
    key = linen_problem.args[2]
    z = jax.random.normal(jax.random.key(3), (3, 6), F64)  # the masks act on z
    f_l = linen_problem.f(z, linen_problem.args)
    f_n = problem.f(z, (problem.args[0], problem.args[1], key))
    _close(f_n, f_l)
    assert not np.allclose(f_n, problem.f(z, problem.args))  # its own key: other masks
    z_l, stats_l = linen.apply(variables, x, train=True, rngs=rngs)
    sol = dj.fixed_point(problem.f, problem.z0, (problem.args[0], x, key), solver=problem.solver)
    _close(sol.value, z_l)
    _close(sol.stats, stats_l)

    def linen_loss(params):
        z, _ = linen.apply({"params": params}, x, train=True, rngs=rngs)
        return _loss(z, w)

    def nnx_loss(state):  # the cell's state: its parameters
        sol = dj.fixed_point(problem.f, problem.z0, (state, x, key), solver=problem.solver)
        return _loss(sol.value, w)

    g_n = jax.grad(nnx_loss)(problem.args[0])
    twin_cell = nnx.clone(model.cell)
    nnx.update(twin_cell, g_n)
    _close(dnx.to_linen(twin_cell)["params"], jax.grad(linen_loss)(variables["params"])["cell"])
    # the call draws the key its problem draws, and solves that problem
    z_call, stats_call = twin(x, train=True)
    own = dj.fixed_point(problem.f, problem.z0, problem.args, solver=problem.solver)
    _close(z_call, own.value)
    _close(stats_call, own.stats)
