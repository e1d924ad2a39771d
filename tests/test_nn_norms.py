"""Tests of weight normalisation, spectral normalisation and the group norm
(`deq_jax.nn.norms`)."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deq_jax as dj
from deq_jax.nn import (
    DEQ,
    SpectralNorm,
    WeightNormConv,
    WeightNormDense,
    state_like,
    weight_norm_kernel,
)
from deq_jax.nn.norms import GroupNorm


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape)


def test_weight_norm_kernel_norms_and_direction():
    v, g = _normal((3, 3, 5, 4), 0), _normal((4,), 1)
    w = weight_norm_kernel(v, g)
    norms = jnp.sqrt(jnp.sum(w**2, axis=(0, 1, 2)))
    np.testing.assert_allclose(norms, jnp.abs(g), rtol=1e-5)
    cos = jnp.sum(w * v, axis=(0, 1, 2)) / (norms * jnp.sqrt(jnp.sum(v**2, axis=(0, 1, 2))))
    np.testing.assert_allclose(cos, jnp.sign(g), rtol=1e-5)
    np.testing.assert_allclose(weight_norm_kernel(3.0 * v, g), w, rtol=1e-5)  # scale-free


def test_weight_norm_kernel_gradient(x64):
    v, g = _normal((4, 3), 0).astype(jnp.float64), _normal((3,), 1).astype(jnp.float64)
    f = lambda v, g: jnp.sum(jnp.sin(weight_norm_kernel(v, g)))
    check_grads(f, (v, g), order=1, modes=["rev"], eps=1e-6)


def test_weight_norm_dense_effective_kernel():
    layer = WeightNormDense(4, use_bias=False)
    eye = jnp.eye(6)
    params = layer.init(jax.random.key(0), eye)["params"]
    assert set(params) == {"kernel", "scale"}
    # g starts at ||v||: the layer starts as a plain dense layer with kernel v.
    np.testing.assert_allclose(layer.apply({"params": params}, eye), params["kernel"], rtol=1e-5)
    params = {**params, "scale": jnp.array([0.5, 1.0, 2.0, 3.0])}
    w_eff = layer.apply({"params": params}, eye)  # rows of I give the kernel, [6, 4]
    np.testing.assert_allclose(jnp.linalg.norm(w_eff, axis=0), params["scale"], rtol=1e-5)
    biased = WeightNormDense(4)
    x = _normal((2, 6), 3)
    variables = biased.init(jax.random.key(0), x)
    assert variables["params"]["bias"].shape == (4,)


@pytest.mark.parametrize("spatial", [(9,), (5, 6)])
def test_weight_norm_conv_matches_flax_conv(spatial):
    n = len(spatial)
    x = _normal((2, *spatial, 3), 0)
    layer = WeightNormConv(4, (3,) * n)
    params = layer.init(jax.random.key(1), x)["params"]
    params = {**params, "scale": jnp.array([0.5, 1.0, 2.0, 3.0]), "bias": jnp.arange(4.0)}
    w_eff = weight_norm_kernel(params["kernel"], params["scale"])
    np.testing.assert_allclose(
        jnp.sqrt(jnp.sum(w_eff**2, axis=tuple(range(n + 1)))), params["scale"], rtol=1e-5
    )
    reference = nn.Conv(4, (3,) * n, padding="SAME").apply(
        {"params": {"kernel": w_eff, "bias": params["bias"]}}, x
    )
    np.testing.assert_allclose(layer.apply({"params": params}, x), reference, rtol=1e-4, atol=1e-5)


def test_weight_norm_conv_bad_rank():
    with pytest.raises(ValueError, match="expects inputs"):
        WeightNormConv(4, (3, 3)).init(jax.random.key(0), jnp.zeros((2, 7, 3)))


def _effective_dense_kernel(layer, variables, n_in):
    return layer.apply(variables, jnp.eye(n_in))  # [n_in, features]


def test_spectral_norm_dense_has_unit_top_singular_value():
    layer = SpectralNorm(nn.Dense(6, use_bias=False), n_steps=50)
    variables = layer.init(jax.random.key(0), jnp.ones((1, 8)))
    w = _effective_dense_kernel(layer, variables, 8)
    assert abs(float(np.linalg.svd(np.asarray(w), compute_uv=False)[0]) - 1.0) < 1e-3
    # The normalised kernel does not depend on the scale of the raw one.
    scaled = jax.tree_util.tree_map(lambda p: 7.0 * p, variables["params"])
    w_scaled = _effective_dense_kernel(layer, {**variables, "params": scaled}, 8)
    np.testing.assert_allclose(w_scaled, w, rtol=1e-4, atol=1e-6)


def test_spectral_norm_power_iteration_advances_only_when_mutable():
    layer = SpectralNorm(nn.Dense(6, use_bias=False), n_steps=1)
    variables = layer.init(jax.random.key(0), jnp.ones((1, 8)))
    eye = jnp.eye(8)
    frozen = layer.apply(variables, eye)  # batch_stats immutable: no update, no error
    np.testing.assert_array_equal(frozen, layer.apply(variables, eye))
    for _ in range(30):
        _, updates = layer.apply(variables, eye, mutable=["batch_stats"])
        variables = {**variables, **updates}
    w = np.asarray(layer.apply(variables, eye))
    assert abs(float(np.linalg.svd(w, compute_uv=False)[0]) - 1.0) < 1e-2


def test_spectral_norm_conv_reshapes_kernel():
    layer = SpectralNorm(nn.Conv(4, (3,), use_bias=False), n_steps=50)
    x = _normal((1, 5, 2), 0)
    variables = layer.init(jax.random.key(0), x)
    assert variables["batch_stats"]["layer_instance/kernel/u"].shape == (1, 4)
    y = layer.apply(variables, x)
    kernel = variables["params"]["layer_instance"]["kernel"]  # [3, 2, 4]
    sigma = np.linalg.svd(np.asarray(kernel).reshape(6, 4), compute_uv=False)[0]
    reference = nn.Conv(4, (3,), use_bias=False).apply({"params": {"kernel": kernel / sigma}}, x)
    np.testing.assert_allclose(y, reference, rtol=1e-3, atol=1e-5)


class _SpectralCell(nn.Module):
    features: int = 5

    def state_spec(self, x):
        return state_like(x, self.features)

    @nn.compact
    def __call__(self, z, x):
        dense = SpectralNorm(nn.Dense(self.features, use_bias=False), n_steps=1)
        return jnp.tanh(0.9 * dense(z) + nn.Dense(self.features)(x))


def _power_step(u, w):
    normalize = lambda a: a / jnp.linalg.norm(a)
    return normalize(normalize(u @ w.T) @ w)


def test_deq_updates_spectral_stats_once_per_forward():
    x = _normal((3, 2), 0)
    model = DEQ(_SpectralCell(), solver=dj.solvers.fixed_point_iteration(tol=1e-6, max_iter=100))
    variables = model.init(jax.random.key(0), x, train=False)
    u_of = lambda v: v["batch_stats"]["cell"]["SpectralNorm_0"]["Dense_0/kernel/u"]
    w = variables["params"]["cell"]["Dense_0"]["kernel"]
    (z, stats), updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
    assert bool(jnp.all(stats.converged))
    # One power step, not one per solver iteration (the solve took several).
    assert int(jnp.min(stats.nstep)) > 3
    np.testing.assert_allclose(u_of(updates), _power_step(u_of(variables), w), rtol=1e-5, atol=1e-6)
    # At eval, and in training with immutable stats, u is not updated (and nothing fails).
    (z_eval, _), same = model.apply(variables, x, train=False, mutable=["batch_stats"])
    np.testing.assert_array_equal(u_of(same), u_of(variables))
    z_train, _ = model.apply(variables, x, train=True)
    np.testing.assert_array_equal(z_train, z_eval)
    assert not np.allclose(z, z_eval, rtol=0, atol=1e-7)  # the solve used the updated u


def _group_norm_pair(shape, groups, dtype, epsilon=1e-5, **fields):
    """flax's and deq_jax's group norm with flax's initial parameters made random, an
    input with a non-zero mean, and a cotangent (all of ``dtype``)."""
    flax_norm = nn.GroupNorm(num_groups=groups, epsilon=epsilon, param_dtype=dtype, **fields)
    ours = GroupNorm(num_groups=groups, epsilon=epsilon, param_dtype=dtype, **fields)
    x = (3.0 * _normal(shape, 0) + 1.5).astype(dtype)
    variables = flax_norm.init(jax.random.key(0), x)
    leaves, tree = jax.tree_util.tree_flatten(variables)
    leaves = [a + 0.3 * _normal(a.shape, i + 1).astype(dtype) for i, a in enumerate(leaves)]
    return flax_norm, ours, jax.tree_util.tree_unflatten(tree, leaves), x


@pytest.mark.parametrize(
    "shape, groups, fields",
    [
        ((3, 6, 5, 12), 4, {}),
        ((2, 7, 8), 2, {}),
        ((4, 6), 3, {}),
        ((2, 5, 5, 8), 8, {"use_scale": False}),
        ((2, 5, 5, 8), 1, {"use_bias": False}),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_group_norm_matches_flax_in_float64(x64, shape, groups, fields, jit):
    flax_norm, ours, variables, x = _group_norm_pair(shape, groups, jnp.float64, **fields)
    assert jax.tree_util.tree_structure(ours.init(jax.random.key(0), x)) == (
        jax.tree_util.tree_structure(variables)
    )
    u = _normal(shape, 9).astype(jnp.float64)
    results = []
    for module in (flax_norm, ours):
        value_and_pullback = lambda v, x, m=module: jax.vjp(m.apply, v, x)
        if jit:
            value_and_pullback = jax.jit(value_and_pullback)
        y, pullback = value_and_pullback(variables, x)
        tangent = jax.jvp(module.apply, (variables, x), (variables, u))[1]
        results.append((y, pullback(u), tangent))
    assert results[1][0].dtype == jnp.float64
    chex.assert_trees_all_close(results[1], results[0], rtol=1e-12, atol=1e-12)


def test_group_norm_matches_flax_in_float32_and_keeps_its_parameters():
    flax_norm, ours, variables, x = _group_norm_pair((8, 14, 14, 120), 8, jnp.float32)
    fresh = jax.tree_util.tree_map(jnp.shape, ours.init(jax.random.key(0), x))
    assert fresh == {"params": {"scale": (120,), "bias": (120,)}}
    chex.assert_trees_all_equal(
        ours.init(jax.random.key(0), x), flax_norm.init(jax.random.key(0), x)
    )
    u = _normal(x.shape, 9)
    (y, pullback), (y_ref, pullback_ref) = (
        jax.jit(lambda v, x, m=m: jax.vjp(m.apply, v, x))(variables, x) for m in (ours, flax_norm)
    )
    chex.assert_trees_all_close((y, pullback(u)), (y_ref, pullback_ref(u)), rtol=1e-4, atol=2e-5)
    # Low-precision inputs: statistics in float32, the result promoted as flax's.
    low = x.astype(jnp.bfloat16)
    y_low, y_low_ref = ours.apply(variables, low), flax_norm.apply(variables, low)
    assert y_low.dtype == y_low_ref.dtype == jnp.float32
    np.testing.assert_allclose(y_low, y_low_ref, rtol=1e-4, atol=1e-4)


def test_group_norm_refuses_groups_that_do_not_divide_the_channels():
    with pytest.raises(ValueError, match="does not divide"):
        GroupNorm(num_groups=5).init(jax.random.key(0), jnp.zeros((2, 4, 12)))
