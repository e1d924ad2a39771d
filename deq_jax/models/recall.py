"""`RecallDEQ`: the deep-thinking "recall" classifier as a DEQ, for any number of
spatial axes.

An input ``x [B, *spatial, C]`` is projected to ``width`` channels (a convolution and a
ReLU), that projection is injected into a convolutional recall cell at every iteration
of the `DEQ`, and the fixed point is read out per position by three convolutions
(``width -> width -> width // 2 -> num_classes``). Every layer is a convolution, so the
same parameters run on any length or image size. `deq_jax.models.PrefixSumDEQ`
(sequences, `Conv1DCell`) and `deq_jax.models.mazes.MazeDEQ` (images, `Conv2DCell`)
are its two instances; they differ only in the cell and the expected input rank.

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax

from deq_jax.nn.cells import Conv1DCell
from deq_jax.nn.conv import Conv
from deq_jax.nn.deq import DEQ
from deq_jax.nn.spec import DEQSpec
from deq_jax.solvers.base import SolverStats


class RecallDEQ(nn.Module):
    """Base of the per-position recall classifiers (see the module docstring).

    Subclasses set ``cell_type`` (a `deq_jax.nn.cells` convolutional cell, whose
    ``spatial_dims`` fixes the input rank) and ``input_layout`` (how the error message
    names the expected input, e.g. ``"inputs [B, L, C]"``); the attributes are theirs.
    A subclass whose input carries a known pixel format may run the DEQ on a coarser
    grid by overriding `to_cell_grid` and `from_cell_grid` (`MazeDEQ`'s ``stem="grid"``).
    """

    cell_type: ClassVar[type[nn.Module]]
    input_layout: ClassVar[str]

    width: int = 32
    num_blocks: int = 2
    kernel_size: int = 3
    num_classes: int = 2
    norm: str | None = None
    norm_groups: int = 4
    weight_norm: bool = False
    dropout_rate: float = 0.0
    deq: DEQSpec = DEQSpec()

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, *spatial, C] -> (logits [B, *spatial, num_classes], stats)``.

        ``deq_options`` (``z0``, ``stats_probe``, ``jacobian_samples``,
        ``spectral_iters``, ``alignment``) go to the `DEQ` call.

        Raises:
          ValueError: unless ``x`` has the cell's spatial axes plus batch and channels.
        """
        spatial_dims = self.cell_type.spatial_dims
        if x.ndim != spatial_dims + 2:
            raise ValueError(
                f"{type(self).__name__} expects {self.input_layout}, got shape {x.shape}."
            )
        x = self.to_cell_grid(x)  # [B, *grid, C']
        window = (self.kernel_size,) * spatial_dims
        conv = lambda features, name: Conv(
            features, window, padding="SAME", use_bias=False, name=name
        )
        u = nn.relu(conv(self.width, "project")(x))  # [B, *grid, width]
        cell = self.cell_type(
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
        )  # [B, *grid, width]
        h = nn.relu(conv(self.width, "head_0")(z))  # [B, *grid, width]
        h = nn.relu(conv(max(self.width // 2, 1), "head_1")(h))  # [B, *grid, width // 2]
        logits = conv(self.num_classes, "head_out")(h)  # [B, *grid, num_classes]
        return self.from_cell_grid(logits), stats  # [B, *spatial, num_classes]

    def to_cell_grid(self, x: jax.Array) -> jax.Array:
        """The input on the grid the DEQ runs on; the identity unless a subclass has a stem."""
        return x

    def from_cell_grid(self, logits: jax.Array) -> jax.Array:
        """Per-grid-point logits back on the input's positions; undoes `to_cell_grid`."""
        return logits


class PrefixSumDEQ(RecallDEQ):
    """Per-position classifier of sequences through a 1-D convolutional DEQ.

    ``x [B, L, C]`` is projected to ``[B, L, width]`` (a convolution and a ReLU), that
    projection is injected into a `Conv1DCell` at every iteration of the `DEQ`, and the
    fixed point ``z* [B, L, width]`` is read out per position by three convolutions
    (``width -> width -> width // 2 -> num_classes``), as in the deep-thinking
    networks. The model is length-agnostic: any ``L`` works with the same parameters.

    Attributes:
      width: channels of the projection, the state and the head.
      num_blocks: residual blocks of the cell.
      kernel_size: the convolution window everywhere.
      num_classes: classes per position (2 for prefix sums).
      norm: the cell's per-sample normalisation (``None``, ``"group"``, ``"layer"``).
      norm_groups: groups of the group norm.
      weight_norm: weight-normalise the cell's convolutions.
      dropout_rate: the cell's variational dropout rate.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    cell_type: ClassVar[type[nn.Module]] = Conv1DCell
    input_layout: ClassVar[str] = "inputs [B, L, C]"
