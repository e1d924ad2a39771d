"""A 2-D convolutional DEQ that marks the path through a maze, pixel by pixel.

`MazeDEQ` is the deep-thinking maze network of Schwarzschild et al. (2021) recast as
an equilibrium model, as in Anil et al. (2022): a 3x3 convolution projects the image,
that projection is injected into a `Conv2DCell` at every iteration of the `DEQ`, and
three 3x3 convolutions read the fixed point out per pixel. Every layer is a
convolution, so a model trained on 9x9 mazes runs unchanged on 13x13 or 33x33 ones,
where more solver iterations can pay off. Registered as ``maze_deq`` in
`deq_jax.models`.

Two stems. ``stem="pixels"`` runs the DEQ on the image's pixels. ``stem="grid"`` uses
the maze format (`deq_jax.tasks.mazes`: a ``(2n + 1)^2`` grid upscaled 2x and framed by
one pixel): it drops the frame, folds each 2x2 block into channels (space to depth), so
the DEQ runs on the grid itself, and repeats the per-grid-point logits back onto the
2x2 blocks, the frame copying its neighbouring outer wall. On the grid a 3x3
convolution moves information one grid point (half a cell) where it moves one pixel
(a quarter cell) on the image, and every iteration costs a quarter as much: dead-end
corridors that the path never enters are ruled out about twice as fast per iteration.

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Bansal et al., "End-to-end Algorithm Synthesis with Recurrent Networks: Logical
  Extrapolation Without Overthinking", NeurIPS 2022.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.recall import RecallDEQ
from deq_jax.nn.cells import Conv2DCell

STEMS = ("pixels", "grid")


class MazeDEQ(RecallDEQ):
    """Per-pixel path classifier of maze images through a 2-D convolutional DEQ.

    ``x [B, H, W, C]`` (C = 3 colour channels for `deq_jax.tasks.mazes`) is projected
    to ``[B, H, W, width]`` (a 3x3 convolution and a ReLU), that projection is injected
    into a `Conv2DCell` at every iteration of the `DEQ`, and the fixed point
    ``z* [B, H, W, width]`` is read out per pixel by three 3x3 convolutions
    (``width -> width -> width // 2 -> num_classes``). The model is fully
    convolutional: any ``H`` and ``W`` work with the same parameters.

    Attributes:
      width: channels of the projection, the state and the head.
      num_blocks: residual blocks of the cell.
      kernel_size: the convolution window everywhere.
      num_classes: classes per pixel (2: off / on the path).
      norm: the cell's per-sample normalisation (``None``, ``"group"``, ``"layer"``).
      norm_groups: groups of the group norm.
      weight_norm: weight-normalise the cell's convolutions.
      dropout_rate: the cell's variational dropout rate.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).
      stem: ``"pixels"`` (the DEQ runs on the image) or ``"grid"`` (on the maze grid;
        the image must be a framed 2x upscale, ``H, W = 2 g + 2``, as the maze task's
        are; see the module docstring).

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    cell_type: ClassVar[type[nn.Module]] = Conv2DCell
    input_layout: ClassVar[str] = "images [B, H, W, C]"

    stem: str = "pixels"

    def __post_init__(self):
        if self.stem not in STEMS:
            raise ValueError(f"stem must be one of {STEMS}, got {self.stem!r}.")
        super().__post_init__()

    def to_cell_grid(self, x: jax.Array) -> jax.Array:
        """``[B, H, W, C]`` -> ``[B, (H - 2) / 2, (W - 2) / 2, 4 C]`` for the grid stem.

        Raises:
          ValueError: if ``H`` or ``W`` is not ``2 g + 2`` for some ``g >= 1``.
        """
        if self.stem == "pixels":
            return x
        b, h, w, c = x.shape
        if h < 4 or w < 4 or h % 2 or w % 2:
            raise ValueError(
                f'MazeDEQ(stem="grid") expects a 2x upscaled grid in a 1-pixel frame '
                f"(H, W = 2 g + 2, even and >= 4), got images of {h}x{w}."
            )
        gh, gw = (h - 2) // 2, (w - 2) // 2
        inner = x[:, 1:-1, 1:-1]  # [B, 2 gh, 2 gw, C]: 2x2 blocks of one grid point
        blocks = inner.reshape(b, gh, 2, gw, 2, c)
        return blocks.transpose(0, 1, 3, 2, 4, 5).reshape(b, gh, gw, 4 * c)

    def from_cell_grid(self, logits: jax.Array) -> jax.Array:
        """``[B, gh, gw, K]`` -> ``[B, 2 gh + 2, 2 gw + 2, K]``: each grid point on its 2x2
        block, the frame a copy of the outer wall next to it (never on a path)."""
        if self.stem == "pixels":
            return logits
        up = jnp.repeat(jnp.repeat(logits, 2, axis=1), 2, axis=2)  # [B, 2 gh, 2 gw, K]
        return jnp.pad(up, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
