"""The pieces of the multiscale cell: the residual block and the multiscale fusion.

* `ResidualBlock`: the per-resolution block of MDEQ (locuslab's ``BasicBlock``), two 3x3
  convolutions with group norms, variational dropout, the injection and the residual.
* `Downsample` / `Upsample`: one fusion path from resolution ``i`` to resolution ``j``
  (strided 3x3 convolutions down, a 1x1 convolution and nearest upsampling up).
* `MultiscaleFusion`: every resolution's sum of all paths into it, then locuslab's
  ``post_fuse_layers`` (ReLU, 1x1 convolution, group norm).

Everything is channels last, ``[B, H, W, C]``; the convolutions have no bias and pad 3x3
windows by one pixel on each side, as PyTorch's ``padding=1`` (flax's ``"SAME"`` pads a
stride-2 window on one side only, which shifts the grid). Group norms use PyTorch's
epsilon, 1e-5.

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (Section 3.2, Figure 2; github.com/locuslab/mdeq, ``lib/models/mdeq_core.py``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.conv import Conv
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.norms import GroupNorm, WeightNormConv

# PyTorch's default convolution initialisation (variance 1 / (3 fan_in)); locuslab's
# weight-normalised convolutions keep it (its N(0, 0.01) re-initialisation only reaches
# the plain ones, and every convolution of the cell is followed by a group norm).
CONV_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
GROUP_NORM_EPS = 1e-5  # PyTorch's
_PAD_3X3 = ((1, 1), (1, 1))  # PyTorch's padding=1


def conv(
    features: int,
    kernel: int,
    *,
    strides: int = 1,
    weight_norm: bool = False,
    use_bias: bool = False,
    name: str | None = None,
) -> nn.Module:
    """A ``kernel x kernel`` convolution (weight-normalised or plain) padded like PyTorch's
    ``padding=kernel // 2``."""
    padding = _PAD_3X3 if kernel == 3 else "VALID"
    if weight_norm:
        return WeightNormConv(
            features,
            (kernel, kernel),
            strides=strides,
            padding=padding,
            use_bias=use_bias,
            kernel_init=CONV_INIT,
            name=name,
        )
    return Conv(
        features,
        (kernel, kernel),
        strides=strides,
        padding=padding,
        use_bias=use_bias,
        kernel_init=CONV_INIT,
        name=name,
    )


def group_norm(num_groups: int, name: str | None = None) -> GroupNorm:
    """A per-sample group norm with PyTorch's epsilon (`deq_jax.nn.norms.GroupNorm`:
    `flax.linen.GroupNorm`'s parameters and values in fewer passes over memory)."""
    return GroupNorm(num_groups=num_groups, epsilon=GROUP_NORM_EPS, name=name)


def post_fuse_groups(num_groups: int) -> int:
    """The groups of the post-fusion norms: locuslab's ``NUM_GROUPS // 2`` (at least 1)."""
    return max(num_groups // 2, 1)


class ResidualBlock(nn.Module):
    """MDEQ's residual block on one resolution, ``[B, h, w, C] -> [B, h, w, C]``.

    ``out = gn3(relu(gn2(drop(conv2(relu(gn1(conv1(z))))) + injection) + z))``: conv1
    widens to ``expansion * C`` channels, conv2 narrows back to ``C``. This is the order of
    locuslab's ``BasicBlock.forward``: the injection is added before ``gn2``, the residual
    after it, and the last group norm comes after the ReLU.

    Attributes:
      channels: ``C``.
      expansion: the width factor of the hidden layer (locuslab's
        ``EXPANSION_FACTOR``).
      num_groups: groups of the three group norms (must divide ``C``).
      weight_norm: weight-normalise both convolutions.
      dropout_rate: `VariationalDropout` rate on conv2's output, one mask per sample
        and channel shared over the pixels (locuslab's ``VariationalHidDropout2d``),
        fixed for a whole solve by the DEQ's single ``"dropout"`` key.

    References:
      Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
      (Figure 2).
    """

    channels: int
    expansion: int = 5
    num_groups: int = 4
    weight_norm: bool = True
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, z: jax.Array, injection: jax.Array | None = None) -> jax.Array:
        """``z [B, h, w, C]``, ``injection [B, h, w, C]`` or ``None`` -> ``[B, h, w, C]``."""
        wide = self.expansion * self.channels
        out = conv(wide, 3, weight_norm=self.weight_norm, name="conv1")(z)  # [B, h, w, eC]
        out = nn.relu(group_norm(self.num_groups, "gn1")(out))
        out = conv(self.channels, 3, weight_norm=self.weight_norm, name="conv2")(out)
        out = VariationalDropout(self.dropout_rate, broadcast_dims=(1, 2), name="drop")(out)
        if injection is not None:
            out = out + injection.astype(out.dtype)
        out = group_norm(self.num_groups, "gn2")(out)  # [B, h, w, C]
        return group_norm(self.num_groups, "gn3")(nn.relu(out + z))


class Downsample(nn.Module):
    """The fusion path from a higher resolution ``i`` to a lower one ``j = i + levels``.

    ``levels`` 3x3 convolutions of stride 2, each followed by a group norm, with a ReLU
    between them (not after the last); the intermediate ones keep the input's channels,
    the last maps to ``features`` (locuslab's ``DownsampleModule``).

    Attributes:
      features: the channels of resolution ``j``.
      levels: ``j - i >= 1``.
      num_groups: groups of the group norms.
    """

    features: int
    levels: int
    num_groups: int = 4

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        """``[B, h, w, C_i] -> [B, h / 2^levels, w / 2^levels, features]``."""
        width = h.shape[-1]
        for k in range(self.levels):
            last = k == self.levels - 1
            h = conv(self.features if last else width, 3, strides=2, name=f"conv{k}")(h)
            h = group_norm(self.num_groups, f"gn{k}")(h)
            if not last:
                h = nn.relu(h)
        return h


class Upsample(nn.Module):
    """The fusion path from a lower resolution ``i`` to a higher one ``j = i - levels``:
    a 1x1 convolution to ``features``, a group norm, then nearest upsampling by
    ``2^levels`` (locuslab's ``UpsampleModule``).

    Attributes:
      features: the channels of resolution ``j``.
      levels: ``i - j >= 1``.
      num_groups: groups of the group norm.
    """

    features: int
    levels: int
    num_groups: int = 4

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        """``[B, h, w, C_i] -> [B, h * 2^levels, w * 2^levels, features]``."""
        h = conv(self.features, 1, name="conv")(h)
        h = group_norm(self.num_groups, "gn")(h)
        factor = 2**self.levels
        return jnp.repeat(jnp.repeat(h, factor, axis=1), factor, axis=2)


class MultiscaleFusion(nn.Module):
    """Mixes the resolutions: output ``j`` is ``post_j(sum_i path_ij(z_i))``.

    ``path_jj`` is the identity, ``path_ij`` a `Downsample` for ``i < j`` and an
    `Upsample` for ``i > j``; ``post_j`` is ReLU, a 1x1 convolution (weight-normalised
    if ``weight_norm``) and a group norm with ``post_fuse_groups(num_groups)`` groups
    (locuslab's ``post_fuse_layers``, which use ``NUM_GROUPS // 2``). As in locuslab,
    only the post-fusion convolutions are weight-normalised, not the paths.

    Attributes:
      channels: ``C_i`` of every resolution, highest resolution first.
      num_groups: groups of the paths' group norms.
      weight_norm: weight-normalise the post-fusion convolutions.
    """

    channels: tuple[int, ...]
    num_groups: int = 4
    weight_norm: bool = True

    @nn.compact
    def __call__(self, zs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        """``zs[i] [B, H / 2^i, W / 2^i, C_i]`` -> a tuple of the same shapes."""
        fused = []
        for j, c_j in enumerate(self.channels):
            y = zs[j]
            for i, z_i in enumerate(zs):
                if i < j:
                    y = y + Downsample(c_j, j - i, self.num_groups, name=f"down_{i}_{j}")(z_i)
                elif i > j:
                    y = y + Upsample(c_j, i - j, self.num_groups, name=f"up_{i}_{j}")(z_i)
            y = conv(c_j, 1, weight_norm=self.weight_norm, name=f"post_conv_{j}")(nn.relu(y))
            fused.append(group_norm(post_fuse_groups(self.num_groups), f"post_gn_{j}")(y))
        return tuple(fused)
