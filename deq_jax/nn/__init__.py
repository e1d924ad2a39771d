"""Flax modules for equilibrium models: the DEQ layer, cells, norms and dropout.

`DEQ` wraps any linen cell ``cell(z, x) -> z`` and returns ``(z_star, stats)``, solving
as its `DEQSpec` says (solver, backward mode, initial state, budgets); the
cells (`MLPCell`, `Conv1DCell`, `Conv2DCell`), weight and spectral normalisation and
`VariationalDropout` (one mask for every iteration) are building blocks for cells.
Every convolution layer is built on `conv_general_dilated` (`Conv` is flax's layer on
it): lax's convolution, whose derivatives XLA:CPU runs fast inside loops; trace a
function whose JVPs alone are evaluated inside `forward_products()`, where it is lax's.
`deq_call`, `outputs_at` and `settled_apply` intercept a whole model's DEQ call;
`run_tied` and `run_untied` unroll cells explicitly (weight-tied and untied stacks).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from deq_jax._forward_mode import forward_products
from deq_jax.nn.cells import Conv1DCell, Conv2DCell, MLPCell
from deq_jax.nn.conv import Conv, conv_general_dilated
from deq_jax.nn.deq import DEQ, EquilibriumProblem, spec_of, with_spec, with_terms
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.intercept import DEQCall, argmax_answer, deq_call, outputs_at, settled_apply
from deq_jax.nn.norms import SpectralNorm, WeightNormConv, WeightNormDense, weight_norm_kernel
from deq_jax.nn.spec import Z_INITS, DEQSpec
from deq_jax.nn.state import initial_state, state_like
from deq_jax.nn.unroll import run_tied, run_untied

__all__ = [
    "DEQ",
    "DEQCall",
    "DEQSpec",
    "Z_INITS",
    "Conv",
    "Conv1DCell",
    "Conv2DCell",
    "EquilibriumProblem",
    "MLPCell",
    "SpectralNorm",
    "VariationalDropout",
    "WeightNormConv",
    "WeightNormDense",
    "argmax_answer",
    "conv_general_dilated",
    "deq_call",
    "forward_products",
    "initial_state",
    "outputs_at",
    "run_tied",
    "run_untied",
    "settled_apply",
    "spec_of",
    "state_like",
    "weight_norm_kernel",
    "with_spec",
    "with_terms",
]
