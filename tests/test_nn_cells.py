"""Tests of the equilibrium cells in `deq_jax.nn.cells`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deq_jax as dj
from deq_jax.nn import DEQ, Conv1DCell, Conv2DCell, MLPCell


def _count(tree):
    return sum(a.size for a in jax.tree_util.tree_leaves(tree))


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, 8 * 8 + 8 + 3 * 8),  # W, b, U
        ({"weight_norm": True}, 8 * 8 + 8 + 8 + 3 * 8),  # + g
        ({"hidden": 16}, 8 * 16 + 16 + 3 * 16 + 16 * 8 + 8),  # W1, b1, U, W2, b2
    ],
)
def test_mlp_cell_parameter_count(kwargs, expected):
    z, x = jnp.zeros((2, 8)), jnp.ones((2, 3))
    params = MLPCell(features=8, **kwargs).init(jax.random.key(0), z, x)["params"]
    assert _count(params) == expected


def test_mlp_cell_known_answer():
    z, x = _normal((5, 4), 1), _normal((5, 3), 2)
    cell = MLPCell(features=4)
    params = cell.init(jax.random.key(0), z, x)["params"]
    w, b = params["recurrent"]["kernel"], params["recurrent"]["bias"]
    u = params["inject"]["kernel"]
    np.testing.assert_allclose(
        cell.apply({"params": params}, z, x), jnp.tanh(z @ w + x @ u + b), rtol=1e-5, atol=1e-6
    )
    assert cell.state_spec(x).shape == (5, 4)


def test_mlp_cell_weight_norm_starts_as_plain():
    z, x = _normal((5, 4), 1), _normal((5, 3), 2)
    plain = MLPCell(features=4, hidden=6)
    normed = MLPCell(features=4, hidden=6, weight_norm=True)
    params = normed.init(jax.random.key(0), z, x)["params"]
    plain_params = {k: {n: v for n, v in d.items() if n != "scale"} for k, d in params.items()}
    np.testing.assert_allclose(
        normed.apply({"params": params}, z, x),
        plain.apply({"params": plain_params}, z, x),
        rtol=1e-5,
        atol=1e-6,
    )


def test_mlp_cell_dropout_only_in_training():
    z, x = _normal((5, 4), 1), _normal((5, 3), 2)
    cell = MLPCell(features=4, dropout_rate=0.5)
    variables = cell.init(jax.random.key(0), z, x)
    eval_out = cell.apply(variables, z, x)
    train_out = cell.apply(variables, z, x, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_array_equal(eval_out, MLPCell(features=4).apply(variables, z, x))
    assert not np.allclose(eval_out, train_out)


def _conv1d_same(x, k):
    """Reference ``SAME`` cross-correlation, ``x [B, L, C]``, ``k [K, C, O]``."""
    pad = k.shape[0] // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (0, 0)))
    return sum(xp[:, i : i + x.shape[1], :] @ k[i] for i in range(k.shape[0]))


def test_conv1d_cell_parameter_count_and_shape():
    z, x = jnp.zeros((2, 10, 8)), jnp.ones((2, 10, 1))
    cell = Conv1DCell(width=8, num_blocks=2)
    params = cell.init(jax.random.key(0), z, x)["params"]
    # input conv 3 * (8 + 1) * 8, then 2 blocks of two 3 * 8 * 8 convs; no biases.
    assert _count(params) == 3 * 9 * 8 + 2 * 2 * 3 * 8 * 8
    assert cell.apply({"params": params}, z, x).shape == (2, 10, 8)
    assert cell.state_spec(x).shape == (2, 10, 8)
    normed = Conv1DCell(width=8, num_blocks=2, weight_norm=True, norm="group", use_bias=True)
    params = normed.init(jax.random.key(0), z, x)["params"]
    # + a bias and a scale per conv (5 convs), + GroupNorm scale and bias per conv.
    assert _count(params) == 3 * 9 * 8 + 2 * 2 * 3 * 8 * 8 + 5 * (8 + 8) + 5 * (8 + 8)


def test_conv1d_cell_known_answer():
    z, x = _normal((2, 7, 4), 1), _normal((2, 7, 2), 2)
    cell = Conv1DCell(width=4, num_blocks=0)
    params = cell.init(jax.random.key(0), z, x)["params"]
    (kernel,) = jax.tree_util.tree_leaves(params)  # [3, 6, 4]
    expected = np.maximum(_conv1d_same(np.concatenate([z, x], -1), np.asarray(kernel)), 0)
    np.testing.assert_allclose(cell.apply({"params": params}, z, x), expected, rtol=1e-5, atol=1e-5)


def test_conv1d_cell_residual_block_known_answer():
    z, x = _normal((2, 7, 4), 1), _normal((2, 7, 2), 2)
    cell = Conv1DCell(width=4, num_blocks=1)
    params = cell.init(jax.random.key(0), z, x)["params"]
    k0, k1, k2 = (np.asarray(params[f"Conv_{i}"]["kernel"]) for i in range(3))
    h = np.maximum(_conv1d_same(np.concatenate([z, x], -1), k0), 0)
    r = _conv1d_same(np.maximum(_conv1d_same(h, k1), 0), k2)
    expected = np.maximum(h + r, 0)
    np.testing.assert_allclose(cell.apply({"params": params}, z, x), expected, rtol=1e-4, atol=1e-5)


def test_conv2d_cell_parameter_count_and_shape():
    z, x = jnp.zeros((2, 6, 5, 8)), jnp.ones((2, 6, 5, 3))
    cell = Conv2DCell(width=8, num_blocks=1)
    params = cell.init(jax.random.key(0), z, x)["params"]
    assert _count(params) == 9 * 11 * 8 + 2 * 9 * 8 * 8
    assert cell.apply({"params": params}, z, x).shape == (2, 6, 5, 8)
    assert cell.state_spec(x).shape == (2, 6, 5, 8)


def test_conv_cells_bad_input():
    with pytest.raises(ValueError, match="norm"):
        Conv1DCell(width=4, norm="batch")
    with pytest.raises(ValueError, match="num_blocks"):
        Conv2DCell(width=4, num_blocks=-1)
    cell = Conv1DCell(width=4)
    with pytest.raises(ValueError, match="expects z"):
        cell.init(jax.random.key(0), jnp.zeros((2, 7, 4)), jnp.zeros((2, 6, 1)))
    with pytest.raises(ValueError, match="expects z"):
        Conv2DCell(width=4).init(jax.random.key(0), jnp.zeros((2, 7, 4)), jnp.zeros((2, 7, 1)))


def test_deq_conv1d_prefix_sum_shapes_and_convergence():
    bits = jax.random.bernoulli(jax.random.key(3), 0.5, (4, 12, 1)).astype(jnp.float32)
    model = DEQ(Conv1DCell(width=8, num_blocks=2), solver=dj.solvers.anderson(tol=1e-3))
    variables = model.init(jax.random.key(0), bits, train=False)
    z, stats = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, bits)
    assert z.shape == (4, 12, 8) and stats.nstep.shape == (4,)
    assert bool(jnp.all(stats.converged)) and bool(jnp.all(jnp.isfinite(z)))


def test_deq_conv2d_shapes_and_gradient():
    x = jax.random.bernoulli(jax.random.key(3), 0.5, (2, 4, 4, 3)).astype(jnp.float32)
    cell = Conv2DCell(width=4, num_blocks=1, weight_norm=True)
    model = DEQ(cell, solver=dj.solvers.fixed_point_iteration(tol=1e-3, max_iter=20))
    params = model.init(jax.random.key(0), x, train=False)["params"]

    def loss(p):
        z, _ = model.apply({"params": p}, x, train=True)
        return jnp.mean(z**2)

    grads = jax.jit(jax.grad(loss))(params)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    assert float(jnp.abs(grads["cell"]["WeightNormConv_0"]["scale"]).max()) > 0
