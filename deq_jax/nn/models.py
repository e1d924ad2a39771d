"""Task models: an input projection, one `DEQ` and a readout, built by name.

Every model is a linen module called as ``model.apply(variables, inputs, train=...,
max_iter=None) -> (logits, stats)``: ``logits`` carry the class scores on the last axis
and ``stats`` are the DEQ's per-sample `deq_jax.SolverStats`. ``max_iter`` overrides
the solver budget of one call, to measure accuracy against test-time compute.

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from deq_jax._registry import Registry
from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.nn.cells import Conv1DCell
from deq_jax.nn.deq import DEQ
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver, SolverStats


class PrefixSumDEQ(nn.Module):
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

    width: int = 32
    num_blocks: int = 2
    kernel_size: int = 3
    num_classes: int = 2
    norm: str | None = None
    norm_groups: int = 4
    weight_norm: bool = False
    dropout_rate: float = 0.0
    solver: Solver = anderson()
    backward: Backward = ift()
    z_init: str = "zeros"
    train_max_iter: int | None = None
    eval_max_iter: int | None = None

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, L, C] -> (logits [B, L, num_classes], stats)``."""
        if x.ndim != 3:
            raise ValueError(f"PrefixSumDEQ expects inputs [B, L, C], got shape {x.shape}.")
        conv = lambda features, name: nn.Conv(
            features, (self.kernel_size,), padding="SAME", use_bias=False, name=name
        )
        u = nn.relu(conv(self.width, "project")(x))  # [B, L, width]
        cell = Conv1DCell(
            self.width,
            num_blocks=self.num_blocks,
            kernel_size=self.kernel_size,
            norm=self.norm,
            norm_groups=self.norm_groups,
            weight_norm=self.weight_norm,
            dropout_rate=self.dropout_rate,
            name="cell",
        )
        deq = DEQ(
            cell,
            solver=self.solver,
            backward=self.backward,
            z_init=self.z_init,
            train_max_iter=self.train_max_iter,
            eval_max_iter=self.eval_max_iter,
            name="deq",
        )
        z, stats = deq(u, train=train, max_iter=max_iter)  # [B, L, width]
        h = nn.relu(conv(self.width, "head_0")(z))
        h = nn.relu(conv(max(self.width // 2, 1), "head_1")(h))
        return conv(self.num_classes, "head_out")(h), stats


_REGISTRY = Registry("model")
_REGISTRY.register("prefix_sum_deq", PrefixSumDEQ)


def register(name: str, ctor: Any, *, overwrite: bool = False) -> Any:
    """Registers a model constructor (a linen module class) under ``name``."""
    return _REGISTRY.register(name, ctor, overwrite=overwrite)


def get(name: str, **kwargs: Any) -> nn.Module:
    """Builds the model registered as ``name`` with attributes ``kwargs``.

    Raises:
      ValueError: for an unknown name or attribute, listing the valid ones.
    """
    return _REGISTRY.get(name, **kwargs)


def names() -> list[str]:
    """Registered model names."""
    return _REGISTRY.names()
