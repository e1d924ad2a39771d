"""Task models: an input projection, one `DEQ` and a readout, built by name.

Every model is a linen module called as ``model.apply(variables, inputs, train=...,
max_iter=None, stats_probe=None, jacobian_samples=0, spectral_iters=0) -> (outputs,
stats)``: ``outputs`` carry the class scores on the last axis (or the regression
prediction) and ``stats`` are the DEQ's per-sample `deq_jax.SolverStats`. ``max_iter``
overrides the solver budget of one call, to measure accuracy against test-time compute;
the last three keywords go to the DEQ unchanged (the backward-statistics probe, and the
Jacobian term and spectral radius it sows into ``"intermediates"``; see `DEQ`).

Registered: ``prefix_sum_deq`` (`PrefixSumDEQ`), ``synthetic_1d_deq``
(`Synthetic1DDEQ`, the 200-parameter DEQ of Bai et al. 2021), ``digits_deq``
(`DigitsDEQ`, a small convolutional DEQ for 8x8 digits, also used for blurry digits),
``maze_deq`` (`deq_jax.nn.maze_model.MazeDEQ`), ``edge_copy_deq`` and
``matrix_inversion_deq`` (`deq_jax.nn.reasoning_models`) and ``clrs_deq``
(`deq_jax.models.clrs.model.ClrsModel`, CLRS algorithms run as a DEQ, to a fixed point by
unrolling, or for the algorithm's true number of steps). Models of tasks with
``batch_extras`` take them as keywords (``adjacency`` for edge copy, the features,
hints and lengths for CLRS).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax._registry import Registry
from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.models.clrs.model import ClrsModel
from deq_jax.nn.cells import Conv1DCell, Conv2DCell
from deq_jax.nn.deq import solve_cell
from deq_jax.nn.maze_model import MazeDEQ
from deq_jax.nn.reasoning_models import EdgeCopyDEQ, MatrixInversionDEQ
from deq_jax.nn.recall import RecallDEQ
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver, SolverStats


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
      solver: the DEQ's forward solver.
      backward: the DEQ's backward mode.
      z_init: the initial state, ``"zeros"``, ``"normal"`` or ``"mixed"``.
      train_max_iter: the solver budget in training (``None``: the solver's).
      eval_max_iter: the solver budget in evaluation (``None``: the solver's).

    References:
      Schwarzschild et al., "Can You Learn an Algorithm?", NeurIPS 2021.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    cell_type: ClassVar[type[nn.Module]] = Conv1DCell
    input_layout: ClassVar[str] = "inputs [B, L, C]"


class ScalarReLUCell(nn.Module):
    """``f(z; x) = W2^T ReLU(W1 z + U x + b)`` for a scalar state and a scalar input.

    Parameters (each ``[hidden]``): ``W1``, ``U``, ``b`` and ``W2``; 200 in all with the
    paper's 50 hidden units. ``f`` is piecewise linear in ``z`` with slope
    ``sum_j W2_j W1_j [unit j active]``, so its Jacobian is that scalar.

    Attributes:
      hidden: hidden units.
      recurrent_std: standard deviation of the initial ``W1``, ``U`` and ``b``.
      out_std: standard deviation of the initial ``W2`` (times ``1 / sqrt(hidden)``).

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (Section 5.1, the synthetic experiment).
    """

    hidden: int = 50
    recurrent_std: float = 1.0
    out_std: float = 0.5

    @nn.compact
    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, 1], x [B, 1] -> f(z; x) [B, 1]``."""
        normal = nn.initializers.normal
        w1 = self.param("W1", normal(self.recurrent_std), (self.hidden,))
        u = self.param("U", normal(self.recurrent_std), (self.hidden,))
        b = self.param("b", normal(self.recurrent_std), (self.hidden,))
        w2 = self.param("W2", normal(self.out_std / self.hidden**0.5), (self.hidden,))
        h = nn.relu(z * w1 + x.astype(z.dtype) * u + b)  # [B, hidden]
        return jnp.sum(h * w2, axis=-1, keepdims=True)  # [B, 1]


class Synthetic1DDEQ(nn.Module):
    """The 200-parameter DEQ of the synthetic 1-D experiment: the prediction is ``z*``.

    ``x [B, 1]`` is injected into a `ScalarReLUCell` and the equilibrium
    ``z* = f(z*; x)`` ``[B, 1]`` is returned as the regression output, with no readout,
    as in the paper.

    Attributes:
      hidden: hidden units of the cell (50: 200 parameters).
      recurrent_std: see `ScalarReLUCell`.
      out_std: see `ScalarReLUCell`.
      solver: the DEQ's forward solver.
      backward: the DEQ's backward mode.
      z_init: the initial state.
      train_max_iter: the solver budget in training (``None``: the solver's).
      eval_max_iter: the solver budget in evaluation (``None``: the solver's).

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (Section 5.1).
    """

    hidden: int = 50
    recurrent_std: float = 1.0
    out_std: float = 0.5
    solver: Solver = anderson()
    backward: Backward = ift()
    z_init: str = "zeros"
    train_max_iter: int | None = None
    eval_max_iter: int | None = None

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, 1] -> (z* [B, 1], stats)``; ``deq_options`` go to the `DEQ` call."""
        if x.ndim != 2 or x.shape[-1] != 1:
            raise ValueError(f"Synthetic1DDEQ expects inputs [B, 1], got shape {x.shape}.")
        cell = ScalarReLUCell(self.hidden, self.recurrent_std, self.out_std, name="cell")
        return solve_cell(self, cell, x, train, max_iter, deq_options)


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
      solver: the DEQ's forward solver.
      backward: the DEQ's backward mode.
      z_init: the initial state.
      train_max_iter: the solver budget in training (``None``: the solver's).
      eval_max_iter: the solver budget in evaluation (``None``: the solver's).

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
    solver: Solver = anderson()
    backward: Backward = ift()
    z_init: str = "zeros"
    train_max_iter: int | None = None
    eval_max_iter: int | None = None

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, H, W, C] -> (logits [B, num_classes], stats)``; ``deq_options`` go to
        the `DEQ` call."""
        if x.ndim != 4:
            raise ValueError(f"DigitsDEQ expects inputs [B, H, W, C], got shape {x.shape}.")
        u = nn.Conv(self.width, (3, 3), padding="SAME", name="project")(x)  # [B, H, W, width]
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
        z, stats = solve_cell(self, cell, u, train, max_iter, deq_options)  # [B, H, W, width]
        pooled = nn.avg_pool(z, (2, 2), strides=(2, 2))  # [B, H/2, W/2, width]
        features = pooled.reshape(pooled.shape[0], -1)  # [B, H/2 * W/2 * width]
        return nn.Dense(self.num_classes, name="head")(features), stats


_REGISTRY = Registry("model")
# The registry's bound methods are this module's public registry functions.
register, get, names = _REGISTRY.register, _REGISTRY.get, _REGISTRY.names
register("prefix_sum_deq", PrefixSumDEQ)
register("synthetic_1d_deq", Synthetic1DDEQ)
register("digits_deq", DigitsDEQ)
register("maze_deq", MazeDEQ)
register("edge_copy_deq", EdgeCopyDEQ)
register("matrix_inversion_deq", MatrixInversionDEQ)
register("clrs_deq", ClrsModel)
