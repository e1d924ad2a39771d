"""A convolution whose gradients XLA:CPU runs on its fast kernels, even inside loops.

`conv_general_dilated` is a drop-in for `jax.lax.conv_general_dilated`, and `Conv` is
`flax.linen.Conv` built on it (every convolution layer of deq_jax uses one of the two).
Its value is the lax convolution's, bit for bit (to rounding for the widening ones,
last item below). What changes, on the CPU backend and for the convolutions of
deq_jax's models (channels last, any stride, no dilation, one feature group, padding
between 0 and ``k - 1`` on each side), is the program they compile to:

* **The input gradient** (what an implicit backward solve evaluates at every iteration)
  is one ordinary convolution of the cotangent with the flipped kernel whose input and
  output channels are swapped. JAX's own transpose rule writes the same product as a
  convolution with a reversed kernel and swapped dimension numbers; XLA:CPU runs that
  form on its fast kernel in straight-line code but on a generic one inside a
  ``while``/``scan`` body (jax-ml/jax#12868): 5-30x slower per call, measured in
  BUILD_NOTES ("Convolution gradients on XLA:CPU"). A strided convolution's input
  gradient is the stride-1 one of the cotangent spread over the stride-1 grid.
* **The weight gradient** is a sum over the kernel's taps of matrix products of a
  shifted input window with the cotangent, instead of XLA:CPU's weight-gradient
  convolution (up to 6x slower on MDEQ's).
* **Widening 2-d convolutions** (`wide_rows_apply`: stride 1, at least twice and at
  least 64 output channels, such as MDEQ's ``C -> 5C`` ones and the input gradients of
  its ``5C -> C`` ones) are computed with one extra output row at each end, which are
  dropped. XLA:CPU (jaxlib 0.10) runs a 2-d float32 convolution on YNNPACK, on one
  core, unless the output is larger than the input; then its own (Eigen) kernel runs
  it on every core. On MDEQ-TINY's ``24 -> 120`` convolutions at 28x28 that is 1.3-1.7x
  faster on 2 idle cores (median and best), the input gradients of its ``120 -> 24`` ones
  1.6x, the cell in a loop 0.78x, its VJP 0.83x (docs/results/mdeq.md, "MDEQ-TINY's
  cell on the CPU"); the value differs from lax's by rounding.

Both are ordinary differentiable operations, so higher derivatives (the Jacobian
regulariser differentiates a VJP) stay exact. Forward-mode products (`jax.jvp`,
`jax.linearize`) remain correct but evaluate the input part in JAX's transposed form,
the slow one inside loops on the CPU (7.5x slower per JVP on MDEQ-TINY's cell). Code
that traces a cell only to push tangents forward (the power iterations of the spectral
radius) does so inside `forward_products()` (`deq_jax.nn.forward_products`, from
`deq_jax._forward_mode`), and there this module traces as lax's convolution. Other
backends, and any other convolution, get `jax.lax.conv_general_dilated` unchanged; the
backend is read when the function is traced (`jax.default_backend`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from deq_jax import _forward_mode

Padding = str | Sequence[tuple[int, int]]
Pads = tuple[tuple[int, int], ...]
Strides = tuple[int, ...]


def channels_last_numbers(ndim: int) -> jax.lax.ConvDimensionNumbers:
    """``[B, *spatial, C]`` inputs and outputs, ``[*window, in, out]`` kernels."""
    spatial = tuple(range(1, ndim - 1))
    return jax.lax.ConvDimensionNumbers(
        lhs_spec=(0, ndim - 1, *spatial),
        rhs_spec=(ndim - 1, ndim - 2, *range(ndim - 2)),
        out_spec=(0, ndim - 1, *spatial),
    )


def _is_channels_last(numbers: Any, lhs: jax.Array, rhs: jax.Array) -> bool:
    expected = channels_last_numbers(lhs.ndim)
    if numbers is None:
        return False
    if not isinstance(numbers, jax.lax.ConvDimensionNumbers):
        numbers = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, numbers)
    return tuple(map(tuple, numbers)) == tuple(map(tuple, expected))


def _ones(value: Any) -> bool:
    return value is None or all(int(v) == 1 for v in value)


def _explicit_pads(
    lhs: jax.Array, rhs: jax.Array, strides: Sequence[int], padding: Padding
) -> tuple[tuple[int, int], ...]:
    if isinstance(padding, str):
        pads = jax.lax.padtype_to_pads(lhs.shape[1:-1], rhs.shape[:-2], strides, padding)
    else:
        pads = padding
    return tuple((int(lo), int(hi)) for lo, hi in pads)


def fast_path_applies(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: Padding,
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    preferred_element_type: Any = None,
) -> bool:
    """Whether `conv_general_dilated` takes its CPU-friendly derivative for this call.

    True on the CPU backend for a channels-last convolution (``[B, *spatial, C]`` with a
    ``[*window, in, out]`` kernel) with any stride, no dilation, one feature and batch
    group, no ``preferred_element_type``, and padding between 0 and ``k - 1`` per side;
    False while tracing for forward-mode products (`deq_jax._forward_mode`), where lax's
    own derivatives are the fast ones.
    """
    if jax.default_backend() != "cpu" or _forward_mode.active():
        return False
    if lhs.ndim < 3 or rhs.ndim != lhs.ndim:
        return False
    if not _is_channels_last(dimension_numbers, lhs, rhs):
        return False
    if not (_ones(lhs_dilation) and _ones(rhs_dilation)):
        return False
    if feature_group_count != 1 or batch_group_count != 1 or preferred_element_type is not None:
        return False
    pads = _explicit_pads(lhs, rhs, window_strides, padding)
    window = rhs.shape[:-2]
    return all(0 <= lo < k and 0 <= hi < k for (lo, hi), k in zip(pads, window, strict=True))


def wide_rows_apply(x: jax.Array, w: jax.Array, strides: Strides, pads: Pads) -> bool:
    """Whether the CPU path computes this convolution with two extra output rows.

    True for a 2-d, stride-1 convolution that widens the channels (at least 2x, to at
    least 64: MDEQ's ``C -> 5C`` convolutions, forward, and its ``5C -> C`` ones'
    input gradients) and whose output rows, padded by one more row at each end, outnumber
    its input rows. XLA:CPU hands a 2-d convolution to YNNPACK, on one core, unless its
    output is larger than its input; then its own convolution kernel runs it on every
    core: on 2 idle cores 1.3-1.7x faster for these (slower for the ``5C -> C`` ones, as
    fast for ``C -> 2C``), so the two rows computed too many cost less than they save.
    On a machine whose other core is busy the gain shrinks (docs/results/mdeq.md,
    "MDEQ-TINY's cell on the CPU").
    """
    if x.ndim != 4 or tuple(strides) != (1, 1):
        return False
    (lo, hi), _ = pads
    c_in, c_out = w.shape[-2:]
    return c_out >= max(2 * c_in, 64) and lo + hi + 3 > w.shape[0]


def _conv(x: jax.Array, w: jax.Array, strides: Strides, pads: Pads, precision: Any) -> jax.Array:
    """The channels-last convolution; where `wide_rows_apply`, computed with one more
    output row at each end of the first spatial axis, which are dropped."""
    wide = wide_rows_apply(x, w, strides, pads)
    if wide:
        (lo, hi), *rest = pads
        pads = ((lo + 1, hi + 1), *rest)
    y = jax.lax.conv_general_dilated(
        x, w, strides, pads, dimension_numbers=channels_last_numbers(x.ndim), precision=precision
    )
    return y[:, 1:-1] if wide else y  # a widened one is [B, h + 2, w, out]


def _every(strides: Strides) -> tuple[slice, ...]:
    """The index that keeps every ``s``-th position of each spatial axis (and the rest)."""
    return (slice(None), *(slice(None, None, s) for s in strides), slice(None))


def _input_linear(tx, w, strides: Strides, pads: Pads, precision: Any) -> jax.Array:
    """``conv(tx, w)``, linear in ``tx``, as every ``s``-th position of the stride-1
    convolution, written as the transpose of its adjoint: a plain stride-1 convolution
    with the flipped, channel-swapped kernel, which reverse mode transposes it back into
    (after spreading the cotangent over the stride-1 grid)."""
    window = w.shape[:-2]
    ones = (1,) * len(window)
    w_adjoint = jnp.flip(w, tuple(range(len(window)))).swapaxes(-1, -2)  # [*window, out, in]
    adjoint_pads = tuple((k - 1 - lo, k - 1 - hi) for (lo, hi), k in zip(pads, window, strict=True))
    adjoint = functools.partial(
        _conv, w=w_adjoint, strides=ones, pads=adjoint_pads, precision=precision
    )
    dense_shape = jax.eval_shape(
        functools.partial(_conv, w=w, strides=ones, pads=pads, precision=precision), tx
    )
    (dense,) = jax.linear_transpose(adjoint, dense_shape)(tx)  # [B, *stride-1 grid, out]
    return dense if strides == ones else dense[_every(strides)]


def _kernel_linear(x, tw, strides: Strides, pads: Pads, precision: Any, out_shape) -> jax.Array:
    """``conv(x, tw)``, linear in ``tw``, as a sum over the kernel's taps of matrix
    products, which reverse mode turns into products of input rows with the cotangent.

    With more input than output channels (and stride 1), each tap multiplies the whole
    padded input and keeps its window of the product, so reverse mode shifts the narrower
    cotangent instead of the input and keeps only the padded input for the backward pass;
    otherwise each tap multiplies its window of the input. (On MDEQ-TINY's two 3x3
    convolutions each choice was the faster one, `benchmarks.conv_cost`.)
    """
    c_in, c_out = tw.shape[-2:]
    padded = jnp.pad(x, ((0, 0), *pads, (0, 0)))  # [B, *padded grid, in]
    shift_output = all(s == 1 for s in strides) and c_in > c_out
    rows_of_padded = padded.reshape(-1, c_in)  # [B * padded grid, in]
    y = None
    for tap in itertools.product(*(range(k) for k in tw.shape[:-2])):
        window = (slice(None),) + tuple(
            slice(t, t + s * (n - 1) + 1, s)
            for t, n, s in zip(tap, out_shape[1:-1], strides, strict=True)
        )
        if shift_output:
            whole = jnp.matmul(rows_of_padded, tw[tap], precision=precision)
            term = whole.reshape(*padded.shape[:-1], c_out)[window].reshape(-1, c_out)
        else:
            rows = padded[window].reshape(-1, c_in)  # [B * out grid, in]
            term = jnp.matmul(rows, tw[tap], precision=precision)  # [B * out grid, out]
        y = term if y is None else y + term
    return y.reshape(out_shape)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _cpu_conv(x, w, strides: Strides, pads: Pads, precision: Any) -> jax.Array:
    return _conv(x, w, strides, pads, precision)


@functools.partial(_cpu_conv.defjvp, symbolic_zeros=True)
def _cpu_conv_jvp(strides, pads, precision, primals, tangents):
    x, w = primals
    tx, tw = tangents
    y = _conv(x, w, strides, pads, precision)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(_input_linear(tx, w, strides, pads, precision))
    if not isinstance(tw, SymbolicZero):
        terms.append(_kernel_linear(x, tw, strides, pads, precision, y.shape))
    if not terms:
        return y, jnp.zeros_like(y)
    return y, functools.reduce(jnp.add, terms).astype(y.dtype)


def conv_general_dilated(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: Padding,
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """`jax.lax.conv_general_dilated` with derivatives XLA:CPU runs fast (module docstring).

    The arguments and the value are those of `jax.lax.conv_general_dilated`. Where
    `fast_path_applies`, the derivatives are built from plain convolutions and matrix
    products; everywhere else this is `jax.lax.conv_general_dilated` itself.
    """
    options = dict(
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count,
        batch_group_count=batch_group_count,
        preferred_element_type=preferred_element_type,
    )
    if not fast_path_applies(lhs, rhs, window_strides, padding, **options):
        return jax.lax.conv_general_dilated(
            lhs, rhs, window_strides, padding, precision=precision, **options
        )
    pads = _explicit_pads(lhs, rhs, window_strides, padding)
    return _cpu_conv(lhs, rhs, tuple(int(s) for s in window_strides), pads, precision)


class Conv(nn.Conv):
    """`flax.linen.Conv` on `conv_general_dilated`: the same layer (attributes, parameter
    names, values), with derivatives XLA:CPU runs fast inside loops."""

    conv_general_dilated: Any = conv_general_dilated
