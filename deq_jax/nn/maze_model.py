"""A 2-D convolutional DEQ that marks the path through a maze, pixel by pixel.

`MazeDEQ` is the deep-thinking maze network of Schwarzschild et al. (2021) recast as
an equilibrium model, as in Anil et al. (2022): a 3x3 convolution projects the image,
that projection is injected into a `Conv2DCell` at every iteration of the `DEQ`, and
three 3x3 convolutions read the fixed point out per pixel. Every layer is a
convolution, so a model trained on 9x9 mazes runs unchanged on 13x13 or 33x33 ones,
where more solver iterations can pay off. Registered as ``maze_deq`` in
`deq_jax.nn.models`.

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

from deq_jax.nn.cells import Conv2DCell
from deq_jax.nn.recall import RecallDEQ


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
      solver: the DEQ's forward solver.
      backward: the DEQ's backward mode.
      z_init: the initial state, ``"zeros"``, ``"normal"`` or ``"mixed"`` (the
        path-independent training of Anil et al.).
      train_max_iter: the solver budget in training (``None``: the solver's).
      eval_max_iter: the solver budget in evaluation (``None``: the solver's).

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    cell_type: ClassVar[type[nn.Module]] = Conv2DCell
    input_layout: ClassVar[str] = "images [B, H, W, C]"
