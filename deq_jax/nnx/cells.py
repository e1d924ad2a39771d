"""Equilibrium cells as NNX modules, each called as ``cell(z, x) -> z``.

`MLPCell`, `Conv1DCell` and `Conv2DCell` are `deq_jax.nn.cells`'s cells for Flax NNX:
the same parameters (initialisers, shapes, `deq_jax.nnx.to_linen` names) and the same
values. Being NNX modules, they are told their input size when built
(``in_features``, ``in_channels``) and create their parameters at once.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Schwarzschild, Borgnia, Gupta, Huang, Vishkin, Goldblum & Goldstein, "Can You
  Learn an Algorithm? Generalizing from Easy to Hard Problems with Recurrent
  Networks", NeurIPS 2021.
  Bansal, Schwarzschild, Borgnia, Emam, Huang, Goldblum & Goldstein, "End-to-end
  Algorithm Synthesis with Recurrent Networks: Logical Extrapolation Without
  Overthinking", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from deq_jax.nn.cells import CONV_INIT, NORMS, RECURRENT_INIT
from deq_jax.nn.conv import conv_general_dilated
from deq_jax.nn.state import float_dtype, state_like
from deq_jax.nnx.dropout import VariationalDropout
from deq_jax.nnx.norms import GroupNorm, WeightNormConv, WeightNormDense

Initializer = Callable[..., jax.Array]
LECUN_NORMAL = nnx.initializers.lecun_normal()  # flax's default kernel initialiser


def _conv(lhs: jax.Array, rhs: jax.Array, *args: Any, out_sharding: Any = None, **kwargs: Any):
    """`deq_jax.nn.conv_general_dilated` taking the ``out_sharding`` that ``nnx.Conv``
    passes (an explicit one gets `jax.lax.conv_general_dilated`, which places it)."""
    if out_sharding is None:
        return conv_general_dilated(lhs, rhs, *args, **kwargs)
    return jax.lax.conv_general_dilated(lhs, rhs, *args, out_sharding=out_sharding, **kwargs)


class MLPCell(nnx.Module):
    """The toy equilibrium cell ``z' = tanh(W z + U x + b)`` (`deq_jax.nn.MLPCell`).

    With ``hidden`` set the map goes through one ReLU layer:
    ``z' = tanh(W2 relu(W1 z + U x + b1) + b2)``. The state is ``[B, features]`` (or
    ``[B, ..., features]`` for ``x [B, ..., in_features]``).

    Args:
      in_features: the input's last axis.
      features: the state size.
      hidden: the hidden width, or ``None`` for the single-layer cell.
      weight_norm: weight-normalise the recurrent layers (``W``, ``W1``, ``W2``).
      dropout_rate: `VariationalDropout` rate applied to the incoming state.
      recurrent_init: initialiser of the recurrent kernels.
      kernel_init: initialiser of the injection kernel ``U``.
      param_dtype: dtype of the parameters.
      rngs: the ``"params"`` stream initialises the parameters.

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """

    def __init__(
        self,
        in_features: int,
        features: int,
        *,
        hidden: int | None = None,
        weight_norm: bool = False,
        dropout_rate: float = 0.0,
        recurrent_init: Initializer = RECURRENT_INIT,
        kernel_init: Initializer = LECUN_NORMAL,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.features, self.hidden_width, self.param_dtype = features, hidden, param_dtype
        self.dropout = VariationalDropout(dropout_rate)
        width = features if hidden is None else hidden
        self.inject = nnx.Linear(
            in_features,
            width,
            use_bias=False,
            kernel_init=kernel_init,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        layer = WeightNormDense if weight_norm else nnx.Linear
        options = dict(kernel_init=recurrent_init, param_dtype=param_dtype, rngs=rngs)
        if hidden is None:
            self.recurrent = layer(features, features, **options)
        else:
            self.hidden = layer(features, hidden, **options)
            self.out = layer(hidden, features, **options)

    def linen_names(self) -> dict[tuple[str, ...], tuple[str, ...]]:
        """The linen cell's names for the parts named otherwise (`deq_jax.nnx.convert`)."""
        return {("dropout",): ("VariationalDropout_0",)}

    def state_spec(self, x: jax.Array) -> jax.ShapeDtypeStruct:
        """``[B, ..., features]`` in the promoted dtype of ``x`` and the parameters."""
        dtype = jnp.promote_types(float_dtype(x.dtype), self.param_dtype)
        return state_like(x, self.features, dtype)

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, ..., features], x [B, ..., in_features] -> z' [B, ..., features]``."""
        z = self.dropout(z)
        inject = self.inject(x)  # [B, ..., width]
        if self.hidden_width is None:
            return jnp.tanh(self.recurrent(z) + inject)
        h = nnx.relu(self.hidden(z) + inject)  # [B, ..., hidden]
        return jnp.tanh(self.out(h))


class _ConvCell(nnx.Module):
    """The recall block shared by `Conv1DCell` and `Conv2DCell`."""

    spatial_dims: ClassVar[int] = 1

    def __init__(
        self,
        in_channels: int,
        width: int,
        *,
        num_blocks: int = 2,
        kernel_size: int = 3,
        use_bias: bool = False,
        norm: str | None = None,
        norm_groups: int = 4,
        weight_norm: bool = False,
        dropout_rate: float = 0.0,
        kernel_init: Initializer = CONV_INIT,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be an integer >= 0, got {num_blocks!r}.")
        self.width, self.norm, self.weight_norm = width, norm, weight_norm
        self.param_dtype = param_dtype
        self.dropout = VariationalDropout(dropout_rate)
        window = (kernel_size,) * self.spatial_dims
        options = dict(use_bias=use_bias, kernel_init=kernel_init, param_dtype=param_dtype)

        def conv(channels_in: int) -> nnx.Module:
            if weight_norm:
                return WeightNormConv(channels_in, width, window, **options, rngs=rngs)
            return nnx.Conv(
                channels_in,
                width,
                window,
                padding="SAME",
                conv_general_dilated=_conv,
                **options,
                rngs=rngs,
            )

        def normalise() -> nnx.Module:
            if norm == "group":
                return GroupNorm(width, num_groups=norm_groups, param_dtype=param_dtype, rngs=rngs)
            return nnx.LayerNorm(width, param_dtype=param_dtype, rngs=rngs)

        layers = 1 + 2 * num_blocks  # the input convolution, then two per block
        convs = [conv(width + in_channels)] + [conv(width) for _ in range(layers - 1)]
        self.convs = nnx.List(convs)
        self.norms = nnx.List([normalise() for _ in range(layers)] if norm else [])

    def linen_names(self) -> dict[tuple[Any, ...], tuple[str, ...]]:
        """The ``@nn.compact`` names of the linen cell's layers (`deq_jax.nnx.convert`)."""
        conv = "WeightNormConv" if self.weight_norm else "Conv"
        norm = {"group": "GroupNorm", "layer": "LayerNorm", None: ""}[self.norm]
        names = {("dropout",): ("VariationalDropout_0",)}
        names.update({("convs", i): (f"{conv}_{i}",) for i in range(len(self.convs))})
        names.update({("norms", i): (f"{norm}_{i}",) for i in range(len(self.norms))})
        return names

    def state_spec(self, x: jax.Array) -> jax.ShapeDtypeStruct:
        """``[B, *spatial, width]`` in the promoted dtype of ``x`` and the parameters."""
        dtype = jnp.promote_types(float_dtype(x.dtype), self.param_dtype)
        return state_like(x, self.width, dtype)

    def _layer(self, h: jax.Array, i: int) -> jax.Array:
        """The ``i``-th convolution, then its norm (if any)."""
        h = self.convs[i](h)
        return self.norms[i](h) if self.norm else h

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, *spatial, width], x [B, *spatial, C] -> z' [B, *spatial, width]``."""
        rank = self.spatial_dims + 2
        if z.ndim != rank or x.ndim != rank or z.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                f"{type(self).__name__} expects z [B, {self.spatial_dims} spatial axes, "
                f"width] and x [B, same spatial axes, C]; got z {z.shape} and x {x.shape}."
            )
        z = self.dropout(z)
        h = jnp.concatenate([z, x.astype(z.dtype)], axis=-1)  # [B, *S, width + C]
        h = nnx.relu(self._layer(h, 0))  # [B, *S, width]
        for block in range(len(self.convs) // 2):
            r = nnx.relu(self._layer(h, 1 + 2 * block))
            h = nnx.relu(h + self._layer(r, 2 + 2 * block))
        return h


class Conv1DCell(_ConvCell):
    """The deep-thinking recall block for sequences (`deq_jax.nn.Conv1DCell`): state
    ``[B, L, width]`` for inputs ``x [B, L, in_channels]``.

    ``z' = blocks(relu(conv([z, x])))`` with ``num_blocks`` residual blocks
    ``h <- relu(h + conv(relu(conv(h))))``, kernel size 3 and no bias by default.

    Args:
      in_channels: the input's channels ``C``.
      width: the state channels.
      num_blocks: residual blocks after the input convolution.
      kernel_size: the convolution window.
      use_bias: whether convolutions have a bias (the deep-thinking nets have none).
      norm: ``None``, ``"group"`` (`GroupNorm`, with ``norm_groups``) or ``"layer"``
        after each convolution.
      norm_groups: groups of the group norm (must divide ``width``).
      weight_norm: weight-normalise every convolution.
      dropout_rate: `VariationalDropout` rate applied to the incoming state.
      kernel_init: initialiser of the kernels (PyTorch's default by default).
      param_dtype: dtype of the parameters.
      rngs: the ``"params"`` stream initialises the parameters.

    Raises:
      ValueError: for an unknown ``norm`` or a negative ``num_blocks``.

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Bansal et al., "End-to-end Algorithm Synthesis with Recurrent Networks",
      NeurIPS 2022.
    """

    spatial_dims: ClassVar[int] = 1


class Conv2DCell(_ConvCell):
    """The deep-thinking recall block for images and mazes (`deq_jax.nn.Conv2DCell`):
    state ``[B, H, W, width]`` for inputs ``x [B, H, W, in_channels]``.

    The same block as `Conv1DCell` with ``kernel_size x kernel_size`` convolutions.

    Args: as `Conv1DCell`.

    Raises:
      ValueError: for an unknown ``norm`` or a negative ``num_blocks``.

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Bansal et al., "End-to-end Algorithm Synthesis with Recurrent Networks",
      NeurIPS 2022.
    """

    spatial_dims: ClassVar[int] = 2
