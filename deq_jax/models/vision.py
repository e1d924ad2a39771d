"""A small convolutional DEQ classifier of images (8x8 digits, blurry digits).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Table 3: accuracy against the inference budget).
  Bai, Koltun, Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from deq_jax.nn.cells import Conv2DCell
from deq_jax.nn.conv import Conv
from deq_jax.nn.deq import DEQ
from deq_jax.nn.spec import DEQSpec
from deq_jax.solvers.base import SolverStats


class DigitsDEQ(nn.Module):
    """A small convolutional DEQ classifier of ``[B, H, W, C]`` images (8x8 digits).

    A 3x3 convolution projects the image to ``width`` channels, that projection is
    injected into a `Conv2DCell` (group norm, weight-normalised convolutions by
    default), and the fixed point ``z* [B, H, W, width]`` is average-pooled over 2x2
    windows, flattened and read out by one dense layer.

    Attributes:
      width: channels of the projection and the state.
      num_blocks: residual blocks of the cell.
      kernel_size: the cell's convolution window.
      num_classes: classes (10).
      norm: the cell's normalisation (``None``, ``"group"``, ``"layer"``).
      norm_groups: groups of the group norm.
      weight_norm: weight-normalise the cell's convolutions.
      dropout_rate: the cell's variational dropout rate.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (Table 3: accuracy against the inference budget).
      Bai, Koltun, Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020 (group
      norm and weight norm in convolutional cells).
    """

    width: int = 16
    num_blocks: int = 1
    kernel_size: int = 3
    num_classes: int = 10
    norm: str | None = "group"
    norm_groups: int = 4
    weight_norm: bool = True
    dropout_rate: float = 0.0
    deq: DEQSpec = DEQSpec()

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, H, W, C] -> (logits [B, num_classes], stats)``; ``deq_options`` go to
        the `DEQ` call."""
        if x.ndim != 4:
            raise ValueError(f"DigitsDEQ expects inputs [B, H, W, C], got shape {x.shape}.")
        u = Conv(self.width, (3, 3), padding="SAME", name="project")(x)  # [B, H, W, width]
        cell = Conv2DCell(
            self.width,
            num_blocks=self.num_blocks,
            kernel_size=self.kernel_size,
            norm=self.norm,
            norm_groups=self.norm_groups,
            weight_norm=self.weight_norm,
            dropout_rate=self.dropout_rate,
            name="cell",
        )
        z, stats = DEQ(cell, spec=self.deq, name="deq")(
            u, train=train, max_iter=max_iter, **deq_options
        )  # [B, H, W, width]
        pooled = nn.avg_pool(z, (2, 2), strides=(2, 2))  # [B, H/2, W/2, width]
        features = pooled.reshape(pooled.shape[0], -1)  # [B, H/2 * W/2 * width]
        return nn.Dense(self.num_classes, name="head")(features), stats
