"""Task models by family, built by name: an input projection, one `DEQ` and a readout.

Every model is a linen module with one `deq_jax.nn.DEQSpec` field, ``deq`` (solver,
backward mode, initial state, budgets), called as ``model.apply(variables, inputs,
train=..., max_iter=None, **deq_options) -> (outputs, stats)``: ``outputs`` carry the
class scores on the last axis (or the regression prediction) and ``stats`` are the
DEQ's per-sample `deq_jax.SolverStats`. ``max_iter`` overrides the budget of one call,
to measure accuracy against test-time compute; ``deq_options`` go to the `DEQ` call
unchanged (the backward-statistics probe, the Jacobian estimates it sows into
``"intermediates"``; see `deq_jax.nn.DEQ`). Models of tasks with ``batch_extras`` take
them as keywords (``adjacency`` for edge copy, the features, hints and lengths for
CLRS).

Registered (``models.get(name, deq=spec, **fields)``): ``prefix_sum_deq``
(`PrefixSumDEQ`, `deq_jax.models.recall`), ``maze_deq`` (`MazeDEQ`,
`deq_jax.models.mazes`), ``edge_copy_deq`` and ``matrix_inversion_deq``
(`deq_jax.models.reasoning`), ``synthetic_1d_deq`` (`Synthetic1DDEQ`, the
200-parameter DEQ of Bai et al. 2021, `deq_jax.models.synthetic`), ``digits_deq``
(`DigitsDEQ`, `deq_jax.models.vision`, also used for blurry digits), ``mdeq``
(`MDEQ`, `deq_jax.models.mdeq`: the multiscale DEQ image classifier, sizes ``TINY``,
``SMALL`` and ``LARGE`` to unpack into ``get``), ``clrs_deq``
(`deq_jax.models.clrs`, CLRS algorithms run as a DEQ) and ``deq_transformer_lm``
(`DEQTransformerLM`, `deq_jax.models.language`: the DEQ-Transformer language model,
which returns an `LMOutput` and takes ``mems`` and ``targets``).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
"""

from deq_jax._registry import Registry
from deq_jax.models.clrs.model import ClrsModel
from deq_jax.models.language import DEQTransformerLM, LMOutput
from deq_jax.models.mazes import MazeDEQ
from deq_jax.models.mdeq import MDEQ
from deq_jax.models.reasoning import EdgeCopyDEQ, MatrixInversionDEQ
from deq_jax.models.recall import PrefixSumDEQ, RecallDEQ
from deq_jax.models.synthetic import ScalarReLUCell, Synthetic1DDEQ
from deq_jax.models.vision import DigitsDEQ

_REGISTRY = Registry("model")
# The registry's bound methods are this package's public registry functions.
register, get, names = _REGISTRY.register, _REGISTRY.get, _REGISTRY.names
register("prefix_sum_deq", PrefixSumDEQ)
register("synthetic_1d_deq", Synthetic1DDEQ)
register("digits_deq", DigitsDEQ)
register("mdeq", MDEQ)
register("maze_deq", MazeDEQ)
register("edge_copy_deq", EdgeCopyDEQ)
register("matrix_inversion_deq", MatrixInversionDEQ)
register("clrs_deq", ClrsModel)
register("deq_transformer_lm", DEQTransformerLM)

__all__ = [
    "ClrsModel",
    "DEQTransformerLM",
    "DigitsDEQ",
    "EdgeCopyDEQ",
    "LMOutput",
    "MDEQ",
    "MatrixInversionDEQ",
    "MazeDEQ",
    "PrefixSumDEQ",
    "RecallDEQ",
    "ScalarReLUCell",
    "Synthetic1DDEQ",
    "get",
    "names",
    "register",
]
