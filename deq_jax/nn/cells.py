"""Equilibrium cells, each a linen module called as ``cell(z, x) -> z``.

* `MLPCell`: the toy-model cell ``z' = tanh(W z + U x + b)`` (optionally through a
  hidden layer), as in the small experiments of the DEQ papers.
* `Conv1DCell` / `Conv2DCell`: the "recall" recurrent block of deep-thinking networks
  for sequences (prefix sums) and images (mazes): a convolution of the state
  concatenated with the input, then residual blocks.

Every cell defines ``state_spec(x)`` (see `deq_jax.nn.DEQ`), may weight-normalise its
recurrent layers, and may apply `VariationalDropout` to the incoming state.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Schwarzschild, Borgnia, Gupta, Huang, Vishkin, Goldblum & Goldstein, "Can You
  Learn an Algorithm? Generalizing from Easy to Hard Problems with Recurrent
  Networks", NeurIPS 2021.
  Bansal, Schwarzschild, Borgnia, Emam, Huang, Goldblum & Goldstein, "End-to-end
  Algorithm Synthesis with Recurrent Networks: Logical Extrapolation Without
  Overthinking", NeurIPS 2022.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.conv import Conv
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.norms import GroupNorm, WeightNormConv, WeightNormDense
from deq_jax.nn.state import float_dtype, state_like

Initializer = Callable[..., jax.Array]

NORMS = (None, "group", "layer")

# Weights of the z -> z' map start with spectral radius about 1/2 (circular law), so a
# freshly initialised tanh cell is close to contractive.
RECURRENT_INIT = nn.initializers.variance_scaling(0.25, "fan_in", "normal")

# PyTorch's default convolution initialisation (variance 1 / (3 fan_in)), which the
# deep-thinking networks use.
CONV_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class MLPCell(nn.Module):
    """The toy equilibrium cell ``z' = tanh(W z + U x + b)``.

    With ``hidden`` set the map goes through one ReLU layer:
    ``z' = tanh(W2 relu(W1 z + U x + b1) + b2)``. The state is ``[B, features]`` (or
    ``[B, ..., features]`` for ``x [B, ..., C]``).

    Attributes:
      features: the state size.
      hidden: the hidden width, or ``None`` for the single-layer cell.
      weight_norm: weight-normalise the recurrent layers (``W``, ``W1``, ``W2``).
      dropout_rate: `VariationalDropout` rate applied to the incoming state.
      recurrent_init: initialiser of the recurrent kernels.
      kernel_init: initialiser of the injection kernel ``U``.
      param_dtype: dtype of the parameters.

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """

    features: int
    hidden: int | None = None
    weight_norm: bool = False
    dropout_rate: float = 0.0
    recurrent_init: Initializer = RECURRENT_INIT
    kernel_init: Initializer = nn.initializers.lecun_normal()
    param_dtype: Any = jnp.float32

    def state_spec(self, x: jax.Array) -> jax.ShapeDtypeStruct:
        """``[B, ..., features]`` in the promoted dtype of ``x`` and the parameters."""
        dtype = jnp.promote_types(float_dtype(x.dtype), self.param_dtype)
        return state_like(x, self.features, dtype)

    def _recurrent(self, features: int, name: str) -> nn.Module:
        if self.weight_norm:
            return WeightNormDense(
                features, kernel_init=self.recurrent_init, param_dtype=self.param_dtype, name=name
            )
        return nn.Dense(
            features, kernel_init=self.recurrent_init, param_dtype=self.param_dtype, name=name
        )

    @nn.compact
    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, ..., features], x [B, ..., C] -> z' [B, ..., features]``."""
        z = VariationalDropout(self.dropout_rate)(z)
        width = self.features if self.hidden is None else self.hidden
        inject = nn.Dense(
            width,
            use_bias=False,
            kernel_init=self.kernel_init,
            param_dtype=self.param_dtype,
            name="inject",
        )(x)  # [B, ..., width]
        if self.hidden is None:
            return jnp.tanh(self._recurrent(self.features, "recurrent")(z) + inject)
        h = nn.relu(self._recurrent(self.hidden, "hidden")(z) + inject)  # [B, ..., hidden]
        return jnp.tanh(self._recurrent(self.features, "out")(h))


class _ConvCell(nn.Module):
    """The recall block shared by `Conv1DCell` and `Conv2DCell`."""

    spatial_dims: ClassVar[int] = 1

    width: int
    num_blocks: int = 2
    kernel_size: int = 3
    use_bias: bool = False
    norm: str | None = None
    norm_groups: int = 4
    weight_norm: bool = False
    dropout_rate: float = 0.0
    kernel_init: Initializer = CONV_INIT
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}.")
        if not isinstance(self.num_blocks, int) or self.num_blocks < 0:
            raise ValueError(f"num_blocks must be an integer >= 0, got {self.num_blocks!r}.")
        super().__post_init__()

    def state_spec(self, x: jax.Array) -> jax.ShapeDtypeStruct:
        """``[B, *spatial, width]`` in the promoted dtype of ``x`` and the parameters."""
        dtype = jnp.promote_types(float_dtype(x.dtype), self.param_dtype)
        return state_like(x, self.width, dtype)

    def _conv(self, h: jax.Array) -> jax.Array:
        window = (self.kernel_size,) * self.spatial_dims
        if self.weight_norm:
            layer = WeightNormConv(
                self.width,
                window,
                use_bias=self.use_bias,
                kernel_init=self.kernel_init,
                param_dtype=self.param_dtype,
            )
        else:
            layer = Conv(
                self.width,
                window,
                padding="SAME",
                use_bias=self.use_bias,
                kernel_init=self.kernel_init,
                param_dtype=self.param_dtype,
            )
        return layer(h)

    def _norm(self, h: jax.Array) -> jax.Array:
        if self.norm == "group":
            return GroupNorm(num_groups=self.norm_groups, param_dtype=self.param_dtype)(h)
        if self.norm == "layer":
            return nn.LayerNorm(param_dtype=self.param_dtype)(h)
        return h

    @nn.compact
    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, *spatial, width], x [B, *spatial, C] -> z' [B, *spatial, width]``."""
        rank = self.spatial_dims + 2
        if z.ndim != rank or x.ndim != rank or z.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                f"{type(self).__name__} expects z [B, {self.spatial_dims} spatial axes, "
                f"width] and x [B, same spatial axes, C]; got z {z.shape} and x {x.shape}."
            )
        z = VariationalDropout(self.dropout_rate)(z)
        h = jnp.concatenate([z, x.astype(z.dtype)], axis=-1)  # [B, *S, width + C]
        h = nn.relu(self._norm(self._conv(h)))  # [B, *S, width]
        for _ in range(self.num_blocks):
            r = nn.relu(self._norm(self._conv(h)))
            r = self._norm(self._conv(r))
            h = nn.relu(h + r)
        return h


class Conv1DCell(_ConvCell):
    """The deep-thinking recall block for sequences: state ``[B, L, width]``.

    ``z' = blocks(relu(conv([z, x])))`` with ``num_blocks`` residual blocks
    ``h <- relu(h + conv(relu(conv(h))))``, kernel size 3 and no bias by default, for
    inputs ``x [B, L, C]`` (e.g. the bits of a prefix-sum problem).

    Attributes:
      width: the state channels.
      num_blocks: residual blocks after the input convolution.
      kernel_size: the convolution window.
      use_bias: whether convolutions have a bias (the deep-thinking nets have none).
      norm: ``None``, ``"group"`` (`deq_jax.nn.norms.GroupNorm`, flax's group norm in
        fewer passes, with ``norm_groups``) or ``"layer"`` after each convolution; both
        are per-sample and help the solve.
      norm_groups: groups of the group norm (must divide ``width``).
      weight_norm: weight-normalise every convolution.
      dropout_rate: `VariationalDropout` rate applied to the incoming state.
      kernel_init: initialiser of the kernels (PyTorch's default by default).
      param_dtype: dtype of the parameters.

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Bansal et al., "End-to-end Algorithm Synthesis with Recurrent Networks",
      NeurIPS 2022.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    spatial_dims: ClassVar[int] = 1


class Conv2DCell(_ConvCell):
    """The deep-thinking recall block for images and mazes: state ``[B, H, W, width]``.

    The same block as `Conv1DCell` with ``kernel_size x kernel_size`` convolutions, for
    inputs ``x [B, H, W, C]``.

    Attributes: as `Conv1DCell`.

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Bansal et al., "End-to-end Algorithm Synthesis with Recurrent Networks",
      NeurIPS 2022.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    spatial_dims: ClassVar[int] = 2
