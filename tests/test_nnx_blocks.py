"""The NNX building blocks (`deq_jax.nnx`'s cells, norms, dropout) against their linen
twins: the same parameters (names, shapes, initial relations) and values; and
`to_linen` / `from_linen`, both ways, with their errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deq_jax as dj
from deq_jax import nnx as dnx

F64 = jnp.float64


def _shapes(tree):
    return jax.tree_util.tree_map(jnp.shape, tree)


def _f64(tree):
    return jax.tree_util.tree_map(lambda a: a.astype(F64), tree)


def _close(a, b, tol=1e-12):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=tol)


# (linen cell, NNX cell, z shape, x shape), float64 parameters.
CELLS = {
    "mlp": (
        lambda: dj.nn.MLPCell(5, param_dtype=F64),
        lambda r: dnx.MLPCell(3, 5, param_dtype=F64, rngs=r),
        (2, 5),
        (2, 3),
    ),
    "mlp_hidden_weight_norm": (
        lambda: dj.nn.MLPCell(5, hidden=7, weight_norm=True, param_dtype=F64),
        lambda r: dnx.MLPCell(3, 5, hidden=7, weight_norm=True, param_dtype=F64, rngs=r),
        (2, 4, 5),
        (2, 4, 3),
    ),
    "conv1d_layer_norm_bias": (
        lambda: dj.nn.Conv1DCell(4, norm="layer", use_bias=True, param_dtype=F64),
        lambda r: dnx.Conv1DCell(2, 4, norm="layer", use_bias=True, param_dtype=F64, rngs=r),
        (2, 6, 4),
        (2, 6, 2),
    ),
    "conv1d_weight_norm": (
        lambda: dj.nn.Conv1DCell(4, num_blocks=1, weight_norm=True, param_dtype=F64),
        lambda r: dnx.Conv1DCell(2, 4, num_blocks=1, weight_norm=True, param_dtype=F64, rngs=r),
        (2, 6, 4),
        (2, 6, 2),
    ),
    "conv2d_group_norm": (
        lambda: dj.nn.Conv2DCell(4, num_blocks=1, norm="group", norm_groups=2, param_dtype=F64),
        lambda r: dnx.Conv2DCell(
            3, 4, num_blocks=1, norm="group", norm_groups=2, param_dtype=F64, rngs=r
        ),
        (2, 4, 4, 4),
        (2, 4, 4, 3),
    ),
}


@pytest.mark.parametrize("name", list(CELLS))
def test_cells_have_the_linen_cells_parameters_and_values(x64, name):
    linen_cell, nnx_cell, z_shape, x_shape = CELLS[name]
    z = jax.random.normal(jax.random.key(1), z_shape, F64)
    x = jax.random.normal(jax.random.key(2), x_shape, F64)
    variables = linen_cell().init(jax.random.key(0), z, x)
    cell = nnx_cell(nnx.Rngs(0))
    assert _shapes(dnx.to_linen(cell)) == _shapes(variables)  # the same names and shapes
    assert cell.state_spec(x) == linen_cell().state_spec(x)
    dnx.from_linen(cell, variables)
    _close(cell(z, x), linen_cell().apply(variables, z, x))
    # and back: the NNX cell's own initial weights run in the linen cell
    fresh = nnx_cell(nnx.Rngs(5))
    _close(linen_cell().apply(dnx.to_linen(fresh), z, x), fresh(z, x))


def test_initial_parameters_follow_the_linen_initialisers():
    cell = dnx.MLPCell(16, 64, hidden=64, weight_norm=True, rngs=nnx.Rngs(0))
    for layer in (cell.hidden, cell.out):  # g starts at ||v||: the plain kernel
        np.testing.assert_allclose(
            dj.nn.weight_norm_kernel(layer.kernel[...], layer.scale[...]), layer.kernel[...], 1e-6
        )
    # recurrent kernels: variance_scaling(0.25, fan_in, normal); U: lecun_normal
    assert abs(float(jnp.std(cell.hidden.kernel[...])) * 8 - 0.5) < 0.05
    assert abs(float(jnp.std(cell.inject.kernel[...])) * 4 - 1.0) < 0.1
    conv = dnx.Conv2DCell(8, 32, norm="group", rngs=nnx.Rngs(0))
    bound = np.sqrt(3 / (3 * 9 * 32))  # PyTorch's default: uniform, variance 1 / (3 fan_in)
    kernel = conv.convs[1].kernel[...]
    assert float(jnp.max(jnp.abs(kernel))) <= bound and float(jnp.max(kernel)) > 0.9 * bound
    np.testing.assert_array_equal(conv.norms[0].scale[...], jnp.ones(32))
    np.testing.assert_array_equal(conv.norms[0].bias[...], jnp.zeros(32))


@pytest.mark.parametrize(
    "linen, make, x_shape",
    [
        (
            dj.nn.WeightNormConv(5, (3, 3), strides=2, padding="VALID", param_dtype=F64),
            lambda r: dnx.WeightNormConv(
                3, 5, (3, 3), strides=2, padding="VALID", param_dtype=F64, rngs=r
            ),
            (2, 7, 7, 3),
        ),
        (
            dj.nn.WeightNormDense(4, use_bias=False, param_dtype=F64),
            lambda r: dnx.WeightNormDense(3, 4, use_bias=False, param_dtype=F64, rngs=r),
            (5, 3),
        ),
        (
            dj.nn.norms.GroupNorm(num_groups=3, use_scale=False, param_dtype=F64),
            lambda r: dnx.GroupNorm(6, num_groups=3, use_scale=False, param_dtype=F64, rngs=r),
            (2, 5, 6),
        ),
    ],
)
def test_norm_layers_equal_their_linen_twins(x64, linen, make, x_shape):
    x = jax.random.normal(jax.random.key(1), x_shape, F64)
    variables = linen.init(jax.random.key(0), x)
    layer = make(nnx.Rngs(0))
    assert _shapes(dnx.to_linen(layer)) == _shapes(variables)
    dnx.from_linen(layer, variables)
    _close(layer(x), linen.apply(variables, x))
    g_l = jax.grad(lambda v: jnp.sum(jnp.sin(linen.apply(v, x))))(variables)
    g_n = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(layer)
    twin = nnx.clone(layer)
    nnx.update(twin, g_n)
    _close(dnx.to_linen(twin), g_l)


class _LinenSpectral(nn.Module):
    def setup(self):
        self.sn = dj.nn.SpectralNorm(nn.Conv(4, (3,), param_dtype=F64), n_steps=2)

    def __call__(self, x):
        return self.sn(x)


def test_spectral_norm_equals_linens_and_never_overwrites_the_kernel(x64):
    x = jax.random.normal(jax.random.key(1), (2, 6, 3), F64)
    linen = _LinenSpectral()
    variables = _f64(linen.init(jax.random.key(0), x))
    conv = nnx.Conv(3, 4, (3,), param_dtype=F64, rngs=nnx.Rngs(0))
    layer = dnx.SpectralNorm(conv, n_steps=2, param_dtype=F64, rngs=nnx.Rngs(0))
    wrapper = nnx.Dict(sn=layer)  # the linen module's scope: the layer under "sn"
    assert _shapes(dnx.to_linen(wrapper)) == _shapes(variables)
    dnx.from_linen(wrapper, variables)
    kernel = conv.kernel[...]
    y_l, updates = linen.apply(variables, x, mutable=["batch_stats"])
    _close(layer(x), y_l)  # a new module updates its stats, as linen with mutable stats
    _close(dnx.to_linen(wrapper)["batch_stats"], updates["batch_stats"])
    np.testing.assert_array_equal(conv.kernel[...], kernel)  # nnx.SpectralNorm would not
    layer.eval()
    stats = dnx.to_linen(wrapper)["batch_stats"]
    layer(x)
    _close(dnx.to_linen(wrapper)["batch_stats"], stats)  # eval mode: read only
    variables = {**variables, **updates}
    g_l = jax.grad(lambda p: jnp.sum(linen.apply({**variables, "params": p}, x) ** 2))(
        variables["params"]
    )
    g_n = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    twin = nnx.clone(wrapper)
    nnx.update(twin["sn"], g_n)
    _close(dnx.to_linen(twin)["params"], g_l)
    with pytest.raises(ValueError, match="error_on_non_matrix"):
        dnx.SpectralNorm(
            nnx.Conv(3, 4, (3,), rngs=nnx.Rngs(0)), error_on_non_matrix=True, rngs=nnx.Rngs(0)
        )


class _LinenStack(nn.Module):
    """A linen module whose sub-modules a ``setup`` assigns, one a list."""

    def setup(self):
        self.layers = [nn.Dense(3), nn.Dense(3)]
        self.head = nn.Dense(2)

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.head(x)


class _Stack(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(3, 2, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.head(x)


def test_a_users_modules_convert_by_linens_setup_names():
    x = jax.random.normal(jax.random.key(1), (4, 3))
    variables = _LinenStack().init(jax.random.key(0), x)
    model = _Stack(nnx.Rngs(0))
    assert dnx.linen_path(model, ("layers", 1, "kernel")) == ("layers_1", "kernel")
    assert _shapes(dnx.to_linen(model)) == _shapes(variables)
    np.testing.assert_allclose(
        dnx.from_linen(model, variables)(x), _LinenStack().apply(variables, x)
    )


def test_from_linen_names_every_mismatch_and_changes_nothing():
    cell = dnx.MLPCell(3, 5, hidden=4, rngs=nnx.Rngs(0))
    before = dnx.to_linen(nnx.clone(cell))
    good = dnx.to_linen(nnx.clone(cell))
    bad = {"params": dict(good["params"])}
    del bad["params"]["out"]
    bad["params"]["extra"] = {"kernel": jnp.ones(2)}
    bad["params"]["inject"] = {"kernel": jnp.ones((2, 4))}
    message = (
        r"missing from the linen variables: params/out/bias, params/out/kernel; "
        r"not in the NNX module: params/extra/kernel; "
        r"shapes differ: params/inject/kernel: \(2, 4\) for \(3, 4\)"
    )
    with pytest.raises(ValueError, match=message):
        dnx.from_linen(cell, bad)
    _close(dnx.to_linen(cell), before, tol=0)
    extras = {**good, "intermediates": {"anything": 1}}  # other collections are ignored
    assert dnx.from_linen(cell, extras) is cell


def test_a_deq_converts_with_its_cell_under_cell():
    model = dnx.DEQ(dnx.MLPCell(3, 5, rngs=nnx.Rngs(0)), eval_max_iter=20)
    x = jax.random.normal(jax.random.key(1), (2, 3))
    linen = dj.nn.DEQ(dj.nn.MLPCell(5), eval_max_iter=20)
    variables = dnx.to_linen(model)
    assert set(variables["params"]) == {"cell"}
    np.testing.assert_array_equal(
        linen.apply(variables, x, train=False)[0], model(x, train=False)[0]
    )


def test_bad_cell_and_norm_settings():
    with pytest.raises(ValueError, match="norm must be one of"):
        dnx.Conv1DCell(2, 4, norm="batch", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_blocks"):
        dnx.Conv2DCell(2, 4, num_blocks=-1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"Number of groups \(3\) does not divide .* \(4\)"):
        dnx.GroupNorm(4, num_groups=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="expects z"):
        dnx.Conv2DCell(2, 4, rngs=nnx.Rngs(0))(jnp.zeros((1, 3, 4)), jnp.zeros((1, 3, 2)))
