"""Weight normalisation and spectral normalisation for equilibrium cells.

Both re-parametrise a layer's kernel to control the Lipschitz constant of the cell,
which keeps the fixed-point problem solvable during training.

* `WeightNormDense` / `WeightNormConv`: ``w = g * v / ||v||`` with one norm and one
  scale ``g`` per output feature, the parametrisation used throughout the DEQ papers.
  ``g`` starts at ``||v||`` so the layer starts exactly as its plain counterpart.
* `GroupNorm`: flax's `flax.linen.GroupNorm` (the same parameters and values) in fewer
  passes over memory, for the group norms of MDEQ and the convolutional cells.
* `SpectralNorm`: flax's `flax.linen.SpectralNorm` wrapper (``w / sigma_max(w)`` by
  power iteration) whose ``update_stats`` defaults to "is the stats collection
  mutable?". Inside a cell, write ``SpectralNorm(nn.Dense(n))(z)``: the power-iteration
  vector ``u`` is then updated only where the caller made ``"batch_stats"`` mutable.
  `deq_jax.nn.DEQ` evaluates its cell once outside the solve when it is training with
  ``mutable=["batch_stats"]`` and runs every solver iteration with the collection
  immutable, so ``u`` advances once per forward pass and the map being solved is the
  same at every iteration.

References:
  Wu & He, "Group Normalization", ECCV 2018.
  Salimans & Kingma, "Weight Normalization: A Simple Reparameterization to Accelerate
  Training of Deep Neural Networks", NeurIPS 2016.
  Miyato, Kataoka, Koyama & Yoshida, "Spectral Normalization for Generative
  Adversarial Networks", ICLR 2018.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.conv import channels_last_numbers, conv_general_dilated

Initializer = Callable[..., jax.Array]


def weight_norm_kernel(v: jax.Array, g: jax.Array, eps: float = 1e-12) -> jax.Array:
    """The weight-normalised kernel ``g * v / ||v||``.

    Args:
      v: the direction, ``[..., out]``; the norm is taken over every axis but the last.
      g: the scale, ``[out]``.
      eps: added under the square root.

    Returns:
      A kernel like ``v`` whose slice ``[..., j]`` has Euclidean norm ``|g[j]|``.
    """
    axes = tuple(range(v.ndim - 1))
    norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=axes, keepdims=True) + eps)  # [1, ..., out]
    return v * (g / norm)


def kernel_norms(v: jax.Array) -> jax.Array:
    """The Euclidean norm of each output slice ``v[..., j]`` (``[out]``): the initial
    scale ``g`` of a weight-normalised kernel, which starts it as its plain kernel."""
    return jnp.sqrt(jnp.sum(jnp.square(v), axis=tuple(range(v.ndim - 1))))


class WeightNormDense(nn.Module):
    """A dense layer with a weight-normalised kernel, ``y = x (g * v / ||v||) + b``.

    Parameters: ``kernel`` (``v``, ``[in, features]``), ``scale`` (``g``,
    ``[features]``, initialised to the column norms of ``v``) and ``bias``.

    Attributes:
      features: output size.
      use_bias: whether to add a bias.
      kernel_init: initialiser of ``v``.
      bias_init: initialiser of the bias.
      param_dtype: dtype of the parameters.

    References:
      Salimans & Kingma, "Weight Normalization", NeurIPS 2016.
    """

    features: int
    use_bias: bool = True
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., in] -> [..., features]``."""
        v = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        g = self.param("scale", lambda _: kernel_norms(v))
        y = jnp.dot(x, weight_norm_kernel(v, g))  # [..., features]
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        return y


class WeightNormConv(nn.Module):
    """An N-d convolution (channels last) with a weight-normalised kernel.

    Parameters: ``kernel`` (``v``, ``[*kernel_size, in, features]``), ``scale`` (``g``,
    ``[features]``, initialised to the per-output-channel norms of ``v``) and ``bias``.
    The input is ``[B, *spatial, in]`` with ``len(spatial) == len(kernel_size)``.

    Attributes:
      features: output channels.
      kernel_size: the window, e.g. ``(3,)`` for sequences or ``(3, 3)`` for images.
      strides: window strides (an int applies to every spatial axis).
      padding: ``"SAME"``, ``"VALID"`` or explicit ``[(lo, hi), ...]`` pairs.
      use_bias: whether to add a bias.
      kernel_init: initialiser of ``v``.
      bias_init: initialiser of the bias.
      param_dtype: dtype of the parameters.

    References:
      Salimans & Kingma, "Weight Normalization", NeurIPS 2016.
    """

    features: int
    kernel_size: Sequence[int]
    strides: int | Sequence[int] = 1
    padding: Any = "SAME"
    use_bias: bool = True
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [B, *spatial, in] -> [B, *spatial', features]``."""
        n = len(self.kernel_size)
        if x.ndim != n + 2:
            raise ValueError(
                f"WeightNormConv with kernel_size {tuple(self.kernel_size)} expects inputs "
                f"[B, {n} spatial axes, C], got shape {x.shape}."
            )
        shape = (*self.kernel_size, x.shape[-1], self.features)
        v = self.param("kernel", self.kernel_init, shape, self.param_dtype)
        g = self.param("scale", lambda _: kernel_norms(v))
        w = weight_norm_kernel(v, g).astype(x.dtype)  # [*k, in, features]
        strides = (self.strides,) * n if isinstance(self.strides, int) else tuple(self.strides)
        numbers = channels_last_numbers(x.ndim)  # [B, *spatial, C] and [*k, in, out]
        y = conv_general_dilated(x, w, strides, self.padding, dimension_numbers=numbers)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        return y


def _fold(sums: jax.Array, num_groups: int, count: int) -> jax.Array:
    """Per-channel sums ``[B, C]`` -> per-group means ``[B, G]`` over ``count`` entries."""
    return jnp.sum(sums.reshape(sums.shape[0], num_groups, -1), axis=-1) / count


def _spread(per_group: jax.Array, like: jax.Array) -> jax.Array:
    """``[B, G] -> [B, 1, ..., 1, C]``: each group's value on each of its channels, shaped
    to broadcast against ``like [B, ..., C]``."""
    b, c = like.shape[0], like.shape[-1]
    per_channel = jnp.repeat(per_group, c // per_group.shape[1], axis=1)  # [B, C]
    return per_channel.reshape(b, *(1,) * (like.ndim - 2), c)


def _channel_sums(x: jax.Array) -> jax.Array:
    """``[B, ..., C] -> [B, C]``: one reduction over the positions of ``x`` seen as
    ``[B, P, C]``."""
    return jnp.sum(x.reshape(x.shape[0], -1, x.shape[-1]), axis=1)


def _moments(x: jax.Array, num_groups: int) -> tuple[jax.Array, jax.Array, int]:
    """The mean and ``E[x^2] - mean^2`` (unclipped) of each sample and group of ``x
    [B, ..., C]``, each from one reduction, and the entries per group."""
    count = x.size // x.shape[0] // num_groups
    mean = _fold(_channel_sums(x), num_groups, count)  # [B, G]
    raw_var = _fold(_channel_sums(jnp.square(x)), num_groups, count) - jnp.square(mean)
    return mean, raw_var, count


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _normalize(x, scale, bias, num_groups: int, epsilon: float) -> jax.Array:
    """``x [B, ..., C]`` normalised per sample and group, times ``scale [C]`` plus
    ``bias [C]`` (flax's fast variance, clipped at 0). The elementwise work is done in
    the shape of ``x``, so that XLA can write the output over a dead input."""
    mean, raw_var, _ = _moments(x, num_groups)
    mul = _spread(jax.lax.rsqrt(jnp.maximum(raw_var, 0.0) + epsilon), x) * scale
    return (x - _spread(mean, x)) * mul + bias


@_normalize.defjvp
def _normalize_jvp(num_groups, epsilon, primals, tangents):
    """The tangent as one pass over ``x`` and its tangent for two per-channel sums and
    one for the output, so that its transpose (the VJP) is likewise two reductions and
    one elementwise pass, with ``x`` and the per-group statistics as its only residuals
    (autodiff of the primal keeps ``2 x`` as well, and writes the cotangent times the
    scale to memory before reducing it)."""
    x, scale, bias = primals
    t_x, t_scale, t_bias = tangents
    mean, raw_var, count = _moments(x, num_groups)
    inv = jax.lax.rsqrt(jnp.maximum(raw_var, 0.0) + epsilon)  # [B, G]
    centred = x - _spread(mean, x)  # [B, ..., C]
    mul = _spread(inv, x) * scale  # [B, 1, ..., 1, C]
    t_mean = _fold(_channel_sums(t_x), num_groups, count)
    t_var = 2.0 * _fold(_channel_sums(centred * t_x), num_groups, count)
    t_inv = jnp.where(raw_var > 0, -0.5 * inv**3 * t_var, 0.0)  # [B, G]
    t_mul = _spread(t_inv, x) * scale + _spread(inv, x) * t_scale
    t_shift = t_bias - _spread(t_mean, x) * mul  # transposes to a sum of the cotangent
    return centred * mul + bias, t_x * mul + centred * t_mul + t_shift


def group_norm(
    x: jax.Array,
    num_groups: int,
    scale: jax.Array | None = None,
    bias: jax.Array | None = None,
    epsilon: float = 1e-6,
    dtype: Any = None,
) -> jax.Array:
    """Per-sample group normalisation of channels-last ``x``, as `flax.linen.GroupNorm`.

    The statistics of each sample and group of ``C / num_groups`` consecutive channels
    are taken over every axis but the first in at least float32: the mean ``m`` and the
    variance ``max(E[x^2] - m^2, 0)`` (flax's fast variance). ``E[x]`` and ``E[x^2]``
    are sums over the positions of ``x`` seen as ``[B, P, C]`` (each a single reduction
    over the middle axis, which XLA:CPU runs as one pass over ``x``), folded into
    groups afterwards; the output ``(x - m) * a + bias``, with the per-sample,
    per-channel ``a = scale / sqrt(var + epsilon)``, is one more pass. The derivative
    is written out the same way (two reductions and one pass, both ways: see
    `_normalize_jvp`). flax's module reduces the grouped view ``[B, P, G, C / G]``
    over two axes: on MDEQ-TINY's group norms its forward pass is 2-6x slower, its
    backward pass about as fast (docs/results/mdeq.md, "MDEQ-TINY's cell on the CPU").

    Args:
      x: ``[B, ..., C]`` with ``C`` divisible by ``num_groups``.
      num_groups: groups of channels.
      scale: ``[C]`` (``None``: 1).
      bias: ``[C]`` (``None``: 0).
      epsilon: added to the variance.
      dtype: of the result (``None``: promoted from ``x``, ``scale`` and ``bias``).

    Returns:
      The normalised ``x``, its shape.
    """
    c = x.shape[-1]
    stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
    args = [a for a in (x, scale, bias) if a is not None]
    scale = jnp.ones((c,), stats_dtype) if scale is None else scale
    bias = jnp.zeros((c,), stats_dtype) if bias is None else bias
    y = _normalize(x.astype(stats_dtype), scale, bias, num_groups, epsilon)
    return y.astype(dtype or jnp.result_type(*args))


class GroupNorm(nn.Module):
    """`flax.linen.GroupNorm` computed by `group_norm`: the same parameters (``scale``,
    ``bias``, ``[C]``), initialisers, epsilon and values, in fewer passes over memory.

    Statistics are per sample over every axis but the first, in at least float32.

    Attributes:
      num_groups: groups of channels (must divide ``C``).
      epsilon: added to the variance (flax's default, 1e-6).
      dtype: of the result (``None``: promoted from the input and the parameters).
      param_dtype: of the parameters.
      use_bias: learn a bias.
      use_scale: learn a scale.
      bias_init: initialiser of the bias.
      scale_init: initialiser of the scale.

    References:
      Wu & He, "Group Normalization", ECCV 2018.
    """

    num_groups: int = 32
    epsilon: float = 1e-6
    dtype: Any = None
    param_dtype: Any = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Initializer = nn.initializers.zeros
    scale_init: Initializer = nn.initializers.ones

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [B, ..., C] -> [B, ..., C]``.

        Raises:
          ValueError: if ``num_groups`` is not a positive divisor of ``C``.
        """
        c = x.shape[-1]
        if self.num_groups < 1 or c % self.num_groups:
            raise ValueError(
                f"Number of groups ({self.num_groups}) does not divide the number of "
                f"channels ({c})."
            )
        scale = bias = None
        if self.use_scale:
            scale = self.param("scale", self.scale_init, (c,), self.param_dtype)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (c,), self.param_dtype)
        return group_norm(x, self.num_groups, scale, bias, self.epsilon, self.dtype)


class SpectralNorm(nn.SpectralNorm):
    """`flax.linen.SpectralNorm` whose ``update_stats`` follows the mutability of its stats.

    Wraps any layer, e.g. ``SpectralNorm(nn.Dense(64))(z)`` or
    ``SpectralNorm(nn.Conv(64, (3, 3)))(z)``, and divides each of its kernels by an
    estimate of its largest singular value from ``n_steps`` power iterations started at
    the stored vector ``u`` (in ``collection_name``, ``"batch_stats"`` by default).
    Without an explicit ``update_stats``, ``u`` and ``sigma`` are written back exactly
    when that collection is mutable; under `deq_jax.nn.DEQ` this is once per training
    forward pass and never inside the solver iterations. Convolution kernels are
    reshaped to ``[prod(kernel_size) * in, out]`` matrices, as in the paper.

    Attributes: see `flax.linen.SpectralNorm` (``layer_instance``, ``n_steps``, ...).

    References:
      Miyato, Kataoka, Koyama & Yoshida, "Spectral Normalization for Generative
      Adversarial Networks", ICLR 2018.
    """

    @nn.compact
    def __call__(self, *args, update_stats: bool | None = None, **kwargs):
        """Calls the wrapped layer with spectrally normalised kernels.

        Args:
          *args: positional arguments of the wrapped layer.
          update_stats: whether to store the new ``u`` and ``sigma``; ``None`` means
            "if the stats collection is mutable".
          **kwargs: keyword arguments of the wrapped layer.

        Returns:
          The wrapped layer's output.
        """
        if update_stats is None:
            update_stats = self.is_mutable_collection(self.collection_name)
        return super().__call__(*args, update_stats=update_stats, **kwargs)
