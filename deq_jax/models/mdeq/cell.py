"""`MultiscaleCell`: MDEQ's equilibrium cell, one state per resolution, fused together.

The state is a tuple of feature maps ``z[i] [B, H / 2^i, W / 2^i, C_i]``, highest
resolution first. One call is locuslab's ``MDEQModule.forward``: a `ResidualBlock` per
resolution (the injection enters the highest resolution only), then the
`MultiscaleFusion` that sums every resolution into every other. The DEQ solves for all
resolutions' equilibria at once.

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (Section 3.2; github.com/locuslab/mdeq, ``lib/models/mdeq_core.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax import _flat
from deq_jax.models.mdeq.blocks import MultiscaleFusion, ResidualBlock, post_fuse_groups
from deq_jax.nn.state import float_dtype


def check_channels(channels: Sequence[int], num_groups: int, expansion: int = 1) -> tuple:
    """``channels`` as a tuple, checked against the group norms that use them.

    Raises:
      ValueError: for no resolution, a non-positive channel count, ``num_groups`` or
        ``expansion`` not a positive integer, or ``num_groups`` (or the post-fusion
        groups, ``num_groups // 2``) not dividing every ``C_i``.
    """
    channels = tuple(channels)
    if not channels or not all(isinstance(c, int) and c >= 1 for c in channels):
        raise ValueError(
            f"channels must be a non-empty sequence of positive integers (one per "
            f"resolution), got {channels!r}."
        )
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be an integer >= 1, got {num_groups!r}.")
    if not isinstance(expansion, int) or expansion < 1:
        raise ValueError(f"expansion must be an integer >= 1, got {expansion!r}.")
    for groups in sorted({num_groups, post_fuse_groups(num_groups)}):
        bad = [c for c in channels if c % groups]
        if bad:
            raise ValueError(
                f"num_groups={num_groups} needs group norms of {groups} groups, which must "
                f"divide every resolution's channels; channels {channels} has {bad}."
            )
    return channels


def check_image(x: Any, num_resolutions: int, what: str = "x") -> None:
    """Checks that ``x`` is ``[B, H, W, C]`` with ``H`` and ``W`` divisible by
    ``2^(num_resolutions - 1)``.

    Raises:
      ValueError: otherwise.
    """
    if jnp.ndim(x) != 4:
        raise ValueError(f"{what} must be images [B, H, W, C], got shape {jnp.shape(x)}.")
    factor = 2 ** (num_resolutions - 1)
    _, h, w, _ = jnp.shape(x)
    if h % factor or w % factor:
        raise ValueError(
            f"{what} has H x W = {h} x {w}; {num_resolutions} resolutions halve it "
            f"{num_resolutions - 1} times, so H and W must be divisible by {factor}."
        )


class MultiscaleCell(nn.Module):
    """MDEQ's cell ``z' = fuse(block_i(z_i, x if i == 0 else None) for each i)``.

    ``x [B, H, W, C_0]`` is the injection (the model's input stem), added to the
    highest resolution only; the lower resolutions are driven by the fusion (locuslab
    injects zeros there). With one resolution the cell is the block alone, without
    fusion, as in locuslab.

    Attributes:
      channels: ``C_i`` of every resolution, highest resolution first.
      expansion: the residual blocks' width factor.
      num_groups: groups of the group norms (must divide every ``C_i``; the
        post-fusion norms use ``num_groups // 2``).
      weight_norm: weight-normalise the blocks' and the post-fusion convolutions (the
        ones locuslab normalises).
      dropout_rate: `VariationalDropout` rate in every block (one mask per solve).

    References:
      Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
    """

    channels: tuple[int, ...]
    expansion: int = 5
    num_groups: int = 4
    weight_norm: bool = True
    dropout_rate: float = 0.0

    def __post_init__(self):
        channels = check_channels(self.channels, self.num_groups, self.expansion)
        object.__setattr__(self, "channels", channels)
        super().__post_init__()

    def state_spec(self, x: jax.Array) -> tuple[jax.ShapeDtypeStruct, ...]:
        """``([B, H, W, C_0], [B, H/2, W/2, C_1], ...)`` in the promoted dtype of ``x``
        and float32.

        Raises:
          ValueError: if ``x`` is not ``[B, H, W, C_0]`` with ``H`` and ``W`` divisible
            by ``2^(len(channels) - 1)``.
        """
        check_image(x, len(self.channels))
        b, h, w, c = jnp.shape(x)
        if c != self.channels[0]:
            raise ValueError(
                f"The injection x must have the highest resolution's {self.channels[0]} "
                f"channels, got shape {jnp.shape(x)}."
            )
        dtype = jnp.promote_types(float_dtype(jnp.result_type(x)), jnp.float32)
        return tuple(
            jax.ShapeDtypeStruct((b, h // 2**i, w // 2**i, c_i), dtype)
            for i, c_i in enumerate(self.channels)
        )

    @nn.compact
    def __call__(self, z: tuple[jax.Array, ...], x: jax.Array) -> tuple[jax.Array, ...]:
        """``z`` (a tuple like `state_spec(x)`), ``x [B, H, W, C_0]`` -> the next ``z``.

        Raises:
          ValueError: if ``z`` does not match `state_spec(x)` in structure and shapes.
        """
        spec = self.state_spec(x)
        z = tuple(z) if isinstance(z, list) else z
        shapes = lambda t: [jnp.shape(a) for a in jax.tree_util.tree_leaves(t)]
        if not isinstance(z, tuple) or len(z) != len(spec) or shapes(z) != shapes(spec):
            raise ValueError(
                f"z must be a tuple of one map per resolution, {_flat.describe(spec)}; got "
                f"{_flat.describe(z)}."
            )
        blocks = [
            ResidualBlock(
                c,
                self.expansion,
                self.num_groups,
                self.weight_norm,
                self.dropout_rate,
                name=f"block_{i}",
            )(z_i, x if i == 0 else None)
            for i, (c, z_i) in enumerate(zip(self.channels, z, strict=True))
        ]  # [B, H / 2^i, W / 2^i, C_i] each
        if len(blocks) == 1:
            return (blocks[0],)
        return MultiscaleFusion(self.channels, self.num_groups, self.weight_norm, name="fuse")(
            tuple(blocks)
        )
