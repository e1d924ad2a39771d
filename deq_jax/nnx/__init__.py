"""Flax NNX modules for equilibrium models: the DEQ layer, cells, norms and dropout.

`DEQ` is `deq_jax.nn.DEQ` for Flax NNX: an ``nnx.Module`` holding its cell (any
``nnx.Module`` called as ``cell(z, x) -> z``) as ``.cell`` and one `deq_jax.nn.DEQSpec`
(the same class), solving through the same `deq_jax.fixed_point`; calling it returns
``(z_star, stats)``. The cells (`MLPCell`, `Conv1DCell`, `Conv2DCell`), the norms
(`WeightNormDense`, `WeightNormConv`, `GroupNorm`, `SpectralNorm`) and
`VariationalDropout` are `deq_jax.nn`'s, with the same parameters and values;
`to_linen` and `from_linen` move weights between the two (docs/nnx.md).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from deq_jax.nnx.cells import Conv1DCell, Conv2DCell, MLPCell
from deq_jax.nnx.convert import from_linen, linen_path, to_linen
from deq_jax.nnx.deq import DEQ
from deq_jax.nnx.dropout import VariationalDropout, hand_keys
from deq_jax.nnx.norms import GroupNorm, SpectralNorm, WeightNormConv, WeightNormDense

__all__ = [
    "DEQ",
    "Conv1DCell",
    "Conv2DCell",
    "GroupNorm",
    "MLPCell",
    "SpectralNorm",
    "VariationalDropout",
    "WeightNormConv",
    "WeightNormDense",
    "from_linen",
    "hand_keys",
    "linen_path",
    "to_linen",
]
