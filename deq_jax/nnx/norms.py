"""Weight, group and spectral normalisation as NNX modules, equal to `deq_jax.nn.norms`.

Each has the parameters (names, shapes, initialisers) and the values of its linen twin
and computes with the same pure functions (`deq_jax.nn.weight_norm_kernel`,
`deq_jax.nn.norms.group_norm`, `deq_jax.nn.conv_general_dilated`):

* `WeightNormDense` / `WeightNormConv`: ``w = g * v / ||v||``, one norm and one scale
  ``g`` per output feature, ``g`` starting at ``||v||``.
* `GroupNorm`: flax's group norm in fewer passes over memory.
* `SpectralNorm`: ``w / sigma_max(w)`` by power iteration from a stored vector ``u``
  (an ``nnx.BatchStat``), as `flax.linen.SpectralNorm`; unlike ``nnx.SpectralNorm`` it
  never writes the normalised kernel over the wrapped layer's parameter.

References:
  Salimans & Kingma, "Weight Normalization: A Simple Reparameterization to Accelerate
  Training of Deep Neural Networks", NeurIPS 2016.
  Wu & He, "Group Normalization", ECCV 2018.
  Miyato, Kataoka, Koyama & Yoshida, "Spectral Normalization for Generative
  Adversarial Networks", ICLR 2018.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deq_jax.nn.conv import channels_last_numbers, conv_general_dilated
from deq_jax.nn.norms import group_norm, kernel_norms, weight_norm_kernel

Initializer = Callable[..., jax.Array]
LECUN_NORMAL = nnx.initializers.lecun_normal()  # flax's default kernel initialiser


class WeightNormDense(nnx.Module):
    """A dense layer with a weight-normalised kernel, ``y = x (g * v / ||v||) + b``.

    Parameters: ``kernel`` (``v``, ``[in, out]``), ``scale`` (``g``, ``[out]``, the
    column norms of ``v`` at the start) and ``bias``, as `deq_jax.nn.WeightNormDense`.

    Args:
      in_features: input size.
      out_features: output size.
      use_bias: whether to add a bias.
      kernel_init: initialiser of ``v``.
      bias_init: initialiser of the bias.
      param_dtype: dtype of the parameters.
      rngs: the ``"params"`` stream initialises ``v``.

    References:
      Salimans & Kingma, "Weight Normalization", NeurIPS 2016.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        kernel_init: Initializer = LECUN_NORMAL,
        bias_init: Initializer = nnx.initializers.zeros,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        v = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
        self.kernel = nnx.Param(v)
        self.scale = nnx.Param(kernel_norms(v))
        self.bias = nnx.data(None)
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., in] -> [..., out]``."""
        y = jnp.dot(x, weight_norm_kernel(self.kernel[...], self.scale[...]))
        return y if self.bias is None else y + self.bias[...]


class WeightNormConv(nnx.Module):
    """An N-d convolution (channels last) with a weight-normalised kernel.

    Parameters: ``kernel`` (``v``, ``[*kernel_size, in, out]``), ``scale`` (``g``,
    ``[out]``, the per-output-channel norms of ``v`` at the start) and ``bias``, as
    `deq_jax.nn.WeightNormConv`; the input is ``[B, *spatial, in]``.

    Args:
      in_features: input channels.
      out_features: output channels.
      kernel_size: the window, e.g. ``(3,)`` for sequences or ``(3, 3)`` for images.
      strides: window strides (an int applies to every spatial axis).
      padding: ``"SAME"``, ``"VALID"`` or explicit ``[(lo, hi), ...]`` pairs.
      use_bias: whether to add a bias.
      kernel_init: initialiser of ``v``.
      bias_init: initialiser of the bias.
      param_dtype: dtype of the parameters.
      rngs: the ``"params"`` stream initialises ``v``.

    References:
      Salimans & Kingma, "Weight Normalization", NeurIPS 2016.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: Sequence[int],
        *,
        strides: int | Sequence[int] = 1,
        padding: Any = "SAME",
        use_bias: bool = True,
        kernel_init: Initializer = LECUN_NORMAL,
        bias_init: Initializer = nnx.initializers.zeros,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.kernel_size = tuple(kernel_size)
        n = len(self.kernel_size)
        self.strides = (strides,) * n if isinstance(strides, int) else tuple(strides)
        self.padding = padding
        shape = (*self.kernel_size, in_features, out_features)
        v = kernel_init(rngs.params(), shape, param_dtype)
        self.kernel = nnx.Param(v)
        self.scale = nnx.Param(kernel_norms(v))
        self.bias = nnx.data(None)
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [B, *spatial, in] -> [B, *spatial', out]``."""
        n = len(self.kernel_size)
        if x.ndim != n + 2:
            raise ValueError(
                f"WeightNormConv with kernel_size {self.kernel_size} expects inputs "
                f"[B, {n} spatial axes, C], got shape {x.shape}."
            )
        w = weight_norm_kernel(self.kernel[...], self.scale[...]).astype(x.dtype)
        numbers = channels_last_numbers(x.ndim)  # [B, *spatial, C] and [*k, in, out]
        y = conv_general_dilated(x, w, self.strides, self.padding, dimension_numbers=numbers)
        return y if self.bias is None else y + self.bias[...]


class GroupNorm(nnx.Module):
    """`deq_jax.nn.norms.GroupNorm` (flax's group norm in fewer passes) for NNX.

    Parameters ``scale`` and ``bias`` (``[C]``); statistics per sample over every axis
    but the first, in at least float32 (`deq_jax.nn.norms.group_norm`).

    Args:
      num_features: the channels ``C``.
      num_groups: groups of channels (must divide ``C``).
      epsilon: added to the variance (flax's default, 1e-6).
      dtype: of the result (``None``: promoted from the input and the parameters).
      param_dtype: of the parameters.
      use_bias: learn a bias.
      use_scale: learn a scale.
      bias_init: initialiser of the bias.
      scale_init: initialiser of the scale.
      rngs: the ``"params"`` stream handed to the initialisers.

    Raises:
      ValueError: if ``num_groups`` is not a positive divisor of ``num_features``.

    References:
      Wu & He, "Group Normalization", ECCV 2018.
    """

    def __init__(
        self,
        num_features: int,
        *,
        num_groups: int = 32,
        epsilon: float = 1e-6,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Initializer = nnx.initializers.zeros,
        scale_init: Initializer = nnx.initializers.ones,
        rngs: nnx.Rngs,
    ):
        if num_groups < 1 or num_features % num_groups:
            raise ValueError(
                f"Number of groups ({num_groups}) does not divide the number of "
                f"channels ({num_features})."
            )
        self.num_groups, self.epsilon, self.dtype = num_groups, epsilon, dtype
        shape = (num_features,)
        self.scale = nnx.data(None)
        self.bias = nnx.data(None)
        if use_scale:
            self.scale = nnx.Param(scale_init(rngs.params(), shape, param_dtype))
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), shape, param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [B, ..., C] -> [B, ..., C]``."""
        scale = None if self.scale is None else self.scale[...]
        bias = None if self.bias is None else self.bias[...]
        return group_norm(x, self.num_groups, scale, bias, self.epsilon, self.dtype)


def _l2_normalize(x: jax.Array, eps: float) -> jax.Array:
    """``x / ||x||`` with ``eps`` under the square root, as flax's spectral norm."""
    return x * jax.lax.rsqrt((x**2).sum() + eps)


class SpectralNorm(nnx.Module):
    """`flax.linen.SpectralNorm` for NNX: the wrapped layer with each kernel divided by
    an estimate of its largest singular value.

    ``SpectralNorm(nnx.Linear(n, n, rngs=rngs), rngs=rngs)(z)`` calls the wrapped layer
    with every parameter of two or more axes ``w`` (a convolution kernel seen as a
    ``[prod(kernel_size) * in, out]`` matrix) replaced by ``w / sigma``; ``sigma`` comes
    from ``n_steps`` power iterations started at the stored vector ``u``. The layer's
    own parameters are never overwritten, so gradients reach ``w`` through ``sigma``,
    as in linen. The estimates are ``nnx.BatchStat`` variables named as linen's
    (``"layer_instance/kernel/u"``, ``".../sigma"``); `deq_jax.nnx.to_linen` gives the
    variables of a linen ``SpectralNorm`` assigned in a ``setup`` (``self.sn =
    SpectralNorm(nn.Dense(n))``).

    ``u`` and ``sigma`` are written back when ``update_stats`` is true: the call
    argument if given, else the module's mode (``model.train()`` turns it on,
    ``model.eval()`` off). Under `deq_jax.nnx.DEQ` they advance once per training solve,
    never inside the solver's iterations.

    Args:
      layer_instance: the wrapped NNX layer.
      n_steps: power iterations per call.
      epsilon: added under the square root of the normalisation.
      dtype: of the normalised parameters (``None``: promoted).
      param_dtype: of ``u`` and ``sigma``.
      error_on_non_matrix: raise on a parameter of more than two axes instead of
        flattening it.
      update_stats: the initial mode: write ``u`` and ``sigma`` back.
      rngs: the ``"params"`` stream draws ``u`` (standard normal, as linen's).

    Raises:
      ValueError: with ``error_on_non_matrix``, for a parameter of more than two axes.

    References:
      Miyato, Kataoka, Koyama & Yoshida, "Spectral Normalization for Generative
      Adversarial Networks", ICLR 2018.
    """

    def __init__(
        self,
        layer_instance: nnx.Module,
        *,
        n_steps: int = 1,
        epsilon: float = 1e-12,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        error_on_non_matrix: bool = False,
        update_stats: bool = True,
        rngs: nnx.Rngs,
    ):
        self.layer_instance = layer_instance
        self.n_steps, self.epsilon, self.dtype = n_steps, epsilon, dtype
        self.error_on_non_matrix = error_on_non_matrix
        self.use_running_average = not update_stats  # what train() / eval() switch
        stats = {}
        for path, param in nnx.to_flat_state(nnx.state(layer_instance, nnx.Param)):
            matrix = self._matrix(param[...])
            if matrix is not None:
                name = "/".join(("layer_instance", *map(str, path)))
                u = jax.random.normal(rngs.params(), (1, matrix.shape[-1]), param_dtype)
                stats[f"{name}/u"] = nnx.BatchStat(u)
                stats[f"{name}/sigma"] = nnx.BatchStat(jnp.ones((), param_dtype))
        self.stats = nnx.data(stats)

    def linen_names(self) -> dict[tuple[str, ...], tuple[str, ...]]:
        """The estimates sit in the module's own linen scope (`deq_jax.nnx.convert`)."""
        return {("stats",): ()}

    def _matrix(self, value: jax.Array) -> jax.Array | None:
        """The parameter as the matrix it normalises, or ``None`` if it is left alone."""
        if value.ndim <= 1 or self.n_steps < 1:
            return None
        if value.ndim > 2 and self.error_on_non_matrix:
            raise ValueError(f"Input is {value.ndim}D but error_on_non_matrix is True")
        return value.reshape(-1, value.shape[-1])

    def __call__(self, *args: Any, update_stats: bool | None = None, **kwargs: Any) -> Any:
        """Calls the wrapped layer with spectrally normalised parameters.

        Args:
          *args: positional arguments of the wrapped layer.
          update_stats: whether to store the new ``u`` and ``sigma`` (``None``: the
            module's mode).
          **kwargs: keyword arguments of the wrapped layer.

        Returns:
          The wrapped layer's output.
        """
        if update_stats is None:
            update_stats = not self.use_running_average
        graphdef, params, rest = nnx.split(self.layer_instance, nnx.Param, ...)

        def normalise(path, param):
            value = param[...]
            w = self._matrix(value)
            if w is None:
                return param
            name = "/".join(("layer_instance", *map(str, path)))
            u = self.stats[f"{name}/u"][...]
            for _ in range(self.n_steps):
                v = _l2_normalize(u @ w.T, self.epsilon)
                u = _l2_normalize(v @ w, self.epsilon)
            u, v = jax.lax.stop_gradient(u), jax.lax.stop_gradient(v)
            sigma = (v @ w @ u.T)[0, 0]
            if update_stats:
                self.stats[f"{name}/u"][...] = u
                self.stats[f"{name}/sigma"][...] = sigma
            dtype = self.dtype or jnp.result_type(value, u, v, sigma)
            w_bar = (w / jnp.where(sigma != 0, sigma, 1)).reshape(value.shape)
            return param.replace(jnp.asarray(w_bar, dtype))

        layer = nnx.merge(graphdef, nnx.map_state(normalise, params), rest)
        out = layer(*args, **kwargs)
        nnx.update(self.layer_instance, nnx.state(layer, nnx.Not(nnx.Param)))  # its own state
        return out
