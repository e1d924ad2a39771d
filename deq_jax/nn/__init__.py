"""Flax modules for equilibrium models: the DEQ layer, cells, norms and dropout.

`DEQ` wraps any linen cell ``cell(z, x) -> z`` and returns ``(z_star, stats)``; the
cells (`MLPCell`, `Conv1DCell`, `Conv2DCell`), weight and spectral normalisation and
`VariationalDropout` (one mask for every iteration) are building blocks for cells.
`deq_call`, `outputs_at` and `settled_apply` intercept a whole model's DEQ call.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from deq_jax.nn.cells import Conv1DCell, Conv2DCell, MLPCell
from deq_jax.nn.deq import DEQ, Z_INITS, EquilibriumProblem, initial_state, solve_cell, state_like
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.intercept import DEQCall, argmax_answer, deq_call, outputs_at, settled_apply
from deq_jax.nn.norms import SpectralNorm, WeightNormConv, WeightNormDense, weight_norm_kernel

__all__ = [
    "DEQ",
    "DEQCall",
    "Z_INITS",
    "Conv1DCell",
    "Conv2DCell",
    "EquilibriumProblem",
    "MLPCell",
    "SpectralNorm",
    "VariationalDropout",
    "WeightNormConv",
    "WeightNormDense",
    "argmax_answer",
    "deq_call",
    "initial_state",
    "outputs_at",
    "settled_apply",
    "solve_cell",
    "state_like",
    "weight_norm_kernel",
]
