"""The DEQ-Transformer language model (Bai et al. 2019) and its explicit baselines.

* `attention`: relative multi-head self-attention (Transformer-XL positions, the
  relative shift, the causal and memory mask);
* `adaptive`: adaptive input embeddings and the adaptive softmax, tied;
* `cell`: the DEQ-Transformer cell ``cell(z, x)`` and the segment `Memory`;
* `stack`: the explicit modes (weight-tied, untied, unrolled with the correction loss);
* `model`: `DEQTransformerLM`, registered as ``"deq_transformer_lm"``.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Dai et al., "Transformer-XL", ACL 2019.
"""

from deq_jax.models.language.adaptive import AdaptiveIO
from deq_jax.models.language.attention import (
    RelativeSelfAttention,
    attention_mask,
    rel_shift,
    sinusoid_positions,
)
from deq_jax.models.language.cell import DEQTransformerCell, Memory, PositionwiseFF
from deq_jax.models.language.model import MODES, DEQTransformerLM, LMOutput
from deq_jax.models.language.stack import correction_steps, correction_weights

__all__ = [
    "MODES",
    "AdaptiveIO",
    "DEQTransformerCell",
    "DEQTransformerLM",
    "LMOutput",
    "Memory",
    "PositionwiseFF",
    "RelativeSelfAttention",
    "attention_mask",
    "correction_steps",
    "correction_weights",
    "rel_shift",
    "sinusoid_positions",
]
