"""Tests of the convolution with CPU-friendly derivatives (`deq_jax.nn.conv`).

Its value must be `jax.lax.conv_general_dilated`'s bit for bit (to rounding where a
widening convolution is computed with two extra rows), and every derivative
(reverse, forward, reverse over reverse, inside loops) must match lax's to rounding;
what it changes is only the program the derivatives compile to.
"""

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from deq_jax import _forward_mode
from deq_jax.nn import WeightNormConv
from deq_jax.nn import conv as conv_lib
from deq_jax.regularizers import spectral_radius

# (input shape, window, padding, stride): 1-d and 2-d, symmetric, lopsided, causal,
# string paddings, 1x1 kernels and strided windows (MDEQ's downsampling path)
CASES = [
    ((2, 7, 6, 3), (3, 3), ((1, 1), (1, 1)), 1),
    ((2, 7, 6, 3), (3, 3), ((0, 2), (2, 0)), 1),
    ((2, 9, 4), (5,), ((4, 0),), 1),
    ((2, 5, 5, 3), (1, 1), ((0, 0), (0, 0)), 1),
    ((2, 5, 5, 3), (3, 3), "SAME", 1),
    ((2, 5, 5, 3), (2, 2), "VALID", 1),
    ((2, 8, 8, 3), (3, 3), ((1, 1), (1, 1)), 2),
    ((2, 7, 9, 3), (3, 3), ((1, 1), (0, 2)), 2),
    ((2, 7, 9, 3), (3, 3), "SAME", 3),
    ((2, 10, 3), (4,), ((1, 2),), 3),
]


def _problem(shape, window, seed=0, out_channels=4):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape))
    w = jnp.asarray(rng.standard_normal((*window, shape[-1], out_channels)))
    return x, w


def _convs(jaxpr) -> list:
    """Every convolution equation in ``jaxpr`` and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated":
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_convs(sub))
    return found


def _conv_rows(jaxpr) -> list[int]:
    """The output rows (axis 1) of every convolution in ``jaxpr`` and its sub-jaxprs."""
    return [o.aval.shape[1] for eqn in _convs(jaxpr) for o in eqn.outvars]


def _conv_numbers(jaxpr) -> list[tuple]:
    """The dimension numbers of every convolution in ``jaxpr`` and its sub-jaxprs."""
    return [tuple(map(tuple, eqn.params["dimension_numbers"])) for eqn in _convs(jaxpr)]


def _assert_first_derivatives_match(fast, reference, x, w, y) -> jax.Array:
    """``fast``'s VJP (at a random cotangent shaped like ``y``) and JVP equal
    ``reference``'s to 1e-12; returns the cotangent."""
    c = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape))
    for got, want in zip(jax.vjp(fast, x, w)[1](c), jax.vjp(reference, x, w)[1](c), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    tangents = (0.3 * x, -w)
    np.testing.assert_allclose(
        jax.jvp(fast, (x, w), tangents)[1],
        jax.jvp(reference, (x, w), tangents)[1],
        rtol=1e-12,
        atol=1e-12,
    )
    return c


def _pair(x, padding, stride):
    """(lax's convolution, this module's) as ``(x, w) -> y`` with channels-last numbers."""
    numbers = conv_lib.channels_last_numbers(x.ndim)
    strides = (stride,) * (x.ndim - 2)
    options = dict(dimension_numbers=numbers)
    reference = lambda x, w: jax.lax.conv_general_dilated(x, w, strides, padding, **options)
    fast = lambda x, w: conv_lib.conv_general_dilated(x, w, strides, padding, **options)
    return reference, fast


@pytest.mark.parametrize("shape, window, padding, stride", CASES)
def test_value_is_lax_bit_for_bit(shape, window, padding, stride):
    x, w = _problem(shape, window)
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    reference, fast = _pair(x, padding, stride)
    np.testing.assert_array_equal(jax.jit(fast)(x, w), jax.jit(reference)(x, w))


@pytest.mark.parametrize("out_channels", [2, 5])  # fewer and more than the 3 inputs
@pytest.mark.parametrize("shape, window, padding, stride", CASES)
def test_derivatives_match_lax(x64, shape, window, padding, stride, out_channels):
    x, w = _problem(shape, window, out_channels=out_channels)
    reference, fast = _pair(x, padding, stride)
    numbers = conv_lib.channels_last_numbers(x.ndim)
    strides = (stride,) * len(window)
    assert conv_lib.fast_path_applies(x, w, strides, padding, dimension_numbers=numbers)
    c = _assert_first_derivatives_match(fast, reference, x, w, reference(x, w))

    def second_order(conv):  # what the Jacobian regulariser does: d/dw ||J^T c||^2
        return jax.grad(lambda w: jnp.sum(jax.vjp(lambda x: conv(x, w), x)[1](c)[0] ** 2))(w)

    np.testing.assert_allclose(
        jax.jit(second_order, static_argnums=0)(fast),
        jax.jit(second_order, static_argnums=0)(reference),
        rtol=1e-12,
        atol=1e-11,
    )


def test_input_gradient_inside_a_loop_matches_lax(x64):
    """What an implicit backward solve does: a VJP of the convolution in a while loop."""
    x, w = _problem((2, 6, 6, 3), (3, 3), out_channels=3)
    reference, fast = _pair(x, ((1, 1), (1, 1)), 1)

    def iterate(conv):
        def body(_, u):
            return 0.5 * jax.vjp(lambda z: conv(z, w), x)[1](u)[0] + x

        return jax.jit(lambda: jax.lax.fori_loop(0, 5, body, x))()

    np.testing.assert_allclose(iterate(fast), iterate(reference), rtol=1e-12)


def test_gradient_is_built_from_channels_last_convolutions():
    """The derivative's convolutions keep the forward's layout: no swapped kernel
    dimensions, the form XLA:CPU runs on a slow kernel inside loops."""
    x, w = _problem((2, 6, 6, 3), (3, 3))
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    reference, fast = _pair(x, ((1, 1), (1, 1)), 1)

    def conv_numbers(conv):
        grad = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))
        return _conv_numbers(jax.make_jaxpr(grad)(x, w).jaxpr)

    expected = tuple(map(tuple, conv_lib.channels_last_numbers(4)))
    assert conv_numbers(fast) and set(conv_numbers(fast)) == {expected}
    assert set(conv_numbers(reference)) != {expected}  # lax's rule swaps them


def test_forward_products_trace_as_lax():
    """Inside `_forward_mode.forward_products` (nestable, undone on errors) the
    convolution traces as lax's; outside, as the custom_jvp."""
    x, w = _problem((2, 6, 6, 3), (3, 3))
    numbers = conv_lib.channels_last_numbers(4)
    conv = lambda x: conv_lib.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    traced = lambda: str(jax.make_jaxpr(lambda x: conv(x))(x))  # fresh: make_jaxpr caches
    assert not _forward_mode.active() and "custom_jvp_call" in traced()
    with _forward_mode.forward_products():
        with _forward_mode.forward_products():
            assert _forward_mode.active()
        assert _forward_mode.active() and "custom_jvp_call" not in traced()
        assert not conv_lib.fast_path_applies(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    with pytest.raises(RuntimeError), _forward_mode.forward_products():
        raise RuntimeError("inside")
    assert not _forward_mode.active() and "custom_jvp_call" in traced()


def test_power_iteration_pushes_tangents_through_plain_convolutions():
    """The spectral radius's JVPs (a scan over `jax.linearize`'s product) run plain
    channels-last convolutions, not the transposed form this module's tangent would
    evaluate to (the slow one inside loops on XLA:CPU), and agree with lax's."""
    x, w = _problem((2, 6, 6, 3), (3, 3), out_channels=3)
    x, w = x.astype(jnp.float32), 0.2 * w.astype(jnp.float32)
    reference, fast = _pair(x, "SAME", 1)
    key = jax.random.key(0)
    rho = {
        name: lambda z, conv=conv: spectral_radius(
            lambda z, w: jnp.tanh(conv(z, w) + x), z, w, key, iters=6
        )
        for name, conv in (("lax", reference), ("deq_jax", fast))
    }
    expected = tuple(map(tuple, conv_lib.channels_last_numbers(4)))
    assert set(_conv_numbers(jax.make_jaxpr(rho["deq_jax"])(x).jaxpr)) == {expected}
    np.testing.assert_allclose(rho["deq_jax"](x), rho["lax"](x), rtol=1e-5)


@pytest.mark.parametrize(
    "change",
    [
        dict(lhs_dilation=(2, 2)),
        dict(rhs_dilation=(2, 2)),
        dict(feature_group_count=3),
        dict(preferred_element_type=jnp.float32),
        dict(padding=((3, 0), (1, 1))),  # more than k - 1 on one side
        dict(padding=((-1, 1), (1, 1))),
        dict(dimension_numbers=("NCHW", "OIHW", "NCHW")),
    ],
)
def test_other_convolutions_are_lax(change):
    x, w = _problem((2, 6, 6, 3), (3, 3), out_channels=3)
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    options = dict(padding=((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
    options.update(change)
    padding = options.pop("padding")
    if change.get("feature_group_count"):
        w = w[:, :, :1]
    if change.get("dimension_numbers"):
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
    assert not conv_lib.fast_path_applies(x, w, (1, 1), padding, **options)
    got = conv_lib.conv_general_dilated(x, w, (1, 1), padding, **options)
    np.testing.assert_array_equal(
        got, jax.lax.conv_general_dilated(x, w, (1, 1), padding, **options)
    )
    jaxpr = jax.make_jaxpr(
        lambda x: conv_lib.conv_general_dilated(x, w, (1, 1), padding, **options)
    )
    assert "custom_jvp_call" not in str(jaxpr(x))


def test_other_backends_get_lax(monkeypatch):
    x, w = _problem((2, 6, 6, 3), (3, 3))
    numbers = conv_lib.channels_last_numbers(4)
    assert conv_lib.fast_path_applies(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not conv_lib.fast_path_applies(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    jaxpr = jax.make_jaxpr(
        lambda x: conv_lib.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    )
    assert "custom_jvp_call" not in str(jaxpr(x))


@pytest.mark.parametrize("window, strides", [((3, 3), 1), ((3,), 1), ((3, 3), 2), ((1, 1), 1)])
def test_conv_layer_is_flax_conv(window, strides):
    """Same parameter names, shapes and values as `flax.linen.Conv`, and the same output."""
    x = jax.random.normal(jax.random.key(0), (2, *(8,) * len(window), 3))
    ours, theirs = (
        layer(5, window, strides=strides, padding="SAME") for layer in (conv_lib.Conv, nn.Conv)
    )
    params = theirs.init(jax.random.key(1), x)
    assert jax.tree.map(jnp.shape, ours.init(jax.random.key(1), x)) == jax.tree.map(
        jnp.shape, params
    )
    np.testing.assert_array_equal(ours.apply(params, x), theirs.apply(params, x))
    assert "custom_jvp_call" in str(jax.make_jaxpr(lambda x: ours.apply(params, x))(x))


def test_weight_norm_conv_takes_the_fast_path():
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    layer = WeightNormConv(4, (3, 3))
    params = layer.init(jax.random.key(1), x)
    assert "custom_jvp_call" in str(jax.make_jaxpr(lambda x: layer.apply(params, x))(x))


def _pads(x, window, strides, padding):
    """Explicit ``(lo, hi)`` pairs of ``padding``."""
    if isinstance(padding, str):
        return tuple(jax.lax.padtype_to_pads(x.shape[1:-1], window, strides, padding))
    return padding


# (input shape, window, padding) of widening convolutions (at least 2x and 64 channels),
# which take `wide_rows_apply`'s form.
WIDE = [
    ((2, 6, 5, 8), (3, 3), ((1, 1), (1, 1))),
    ((2, 6, 5, 8), (3, 3), "SAME"),
    ((2, 5, 7, 3), (3, 3), ((0, 2), (2, 0))),
    ((2, 4, 4, 8), (5, 3), ((2, 2), (1, 1))),
]


@pytest.mark.parametrize("shape, window, padding", WIDE)
def test_widening_convolutions_compute_two_extra_rows_and_match_lax(x64, shape, window, padding):
    x, w = _problem(shape, window, out_channels=64)
    assert conv_lib.wide_rows_apply(x, w, (1, 1), _pads(x, window, (1, 1), padding))
    reference, fast = _pair(x, padding, 1)
    rows = _conv_rows(jax.make_jaxpr(fast)(x, w).jaxpr)
    assert rows and all(r == shape[1] + 2 for r in rows)  # the custom_jvp's primal: h + 2
    y = reference(x, w)
    np.testing.assert_allclose(jax.jit(fast)(x, w), y, rtol=1e-12, atol=1e-12)
    _assert_first_derivatives_match(fast, reference, x, w, y)


def test_narrowing_convolutions_input_gradient_is_widening_inside_a_loop(x64):
    """A ``5C -> C`` convolution's input gradient is a ``C -> 5C`` one: widened, and
    right, inside the loop of an implicit backward solve."""
    x, w = _problem((2, 5, 6, 64), (3, 3), out_channels=8)
    w = 0.05 * w
    reference, fast = _pair(x, ((1, 1), (1, 1)), 1)
    u = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, 6, 8)))

    def iterate(conv):
        def body(_, v):
            return 0.5 * jax.vjp(lambda z: conv(z, w), x)[1](u)[0] + v

        return jax.jit(lambda: jax.lax.fori_loop(0, 3, body, x))()

    np.testing.assert_allclose(iterate(fast), iterate(reference), rtol=1e-12, atol=1e-12)
    pullback = jax.vjp(lambda z: fast(z, w), x)[1]
    rows = set(_conv_rows(jax.make_jaxpr(pullback)(u).jaxpr))
    assert rows == {7}, rows  # the input gradient's convolution: h + 2 rows


def test_widening_convolution_matches_lax_in_float32():
    x, w = _problem((4, 10, 9, 24), (3, 3), out_channels=120)
    x, w = x.astype(jnp.float32), (0.05 * w).astype(jnp.float32)
    reference, fast = _pair(x, ((1, 1), (1, 1)), 1)
    np.testing.assert_allclose(jax.jit(fast)(x, w), jax.jit(reference)(x, w), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "shape, window, padding, stride, out_channels",
    [
        ((2, 6, 5, 8), (3, 3), ((1, 1), (1, 1)), 2, 64),  # strided
        ((2, 6, 5, 40), (3, 3), ((1, 1), (1, 1)), 1, 64),  # less than 2x wider
        ((2, 6, 5, 8), (3, 3), ((1, 1), (1, 1)), 1, 32),  # fewer than 64 channels
        ((2, 6, 5, 8), (3, 3), ((0, 0), (1, 1)), 1, 64),  # output rows within the input's
        ((2, 9, 8), (3,), ((1, 1),), 1, 64),  # 1-d
    ],
)
def test_other_convolutions_are_not_widened(shape, window, padding, stride, out_channels):
    x, w = _problem(shape, window, out_channels=out_channels)
    strides = (stride,) * len(window)
    assert not conv_lib.wide_rows_apply(x, w, strides, _pads(x, window, strides, padding))
