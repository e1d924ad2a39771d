"""The DEQ-Transformer cell: one Transformer-XL decoder block with input injection.

The state ``z [B, L, d_model]`` holds one vector per position of the current segment.
One application of the cell is

    z <- FF(Attn(z; [memory, z], injection))

where the attention (`deq_jax.models.language.attention.RelativeSelfAttention`) adds
the injection ``[B, M + L, 3 H D_h]`` (a linear map of the token embeddings of the
memory and the segment) to its q, k, v projections, and ``FF`` is the position-wise
feed-forward block with its residual. The cell's input is the dict
``x = {"injection": [B, L, 3 H D_h], "memory": Memory}``: the injection of the
segment under the key ``"injection"`` (what a learned initialiser reads), and the
previous segment's fixed points with their injections, a `Memory` of fixed length.

Two placements of the layer norms:

* ``"post"`` (locuslab/deq): ``z1 = LN(z + attn)``, ``z' = LN(z1 + FF(z1))``, layer
  norms without parameters;
* ``"pre"`` (torchdeq's deq-lm): ``z1 = z + o(LN(attn(LN([mem, z]))))``,
  ``z' = z1 + FF(LN(z1))``, learned layer norms.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Dai et al., "Transformer-XL", ACL 2019.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the pre-LN DEQ-Transformer).
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.language.attention import (
    RelativeSelfAttention,
    attention_mask,
    dense,
    layer_norm,
)
from deq_jax.nn.dropout import VariationalDropout

LN_PLACEMENTS = ("post", "pre")


class Memory(NamedTuple):
    """Segment memory of a DEQ-Transformer: always ``M = mem_len`` slots, right-aligned.

    Slot ``M - 1`` holds the most recent position; only the last ``count`` slots are
    valid (the others are masked out of attention). Carries no gradient.

    Attributes:
      z: the fixed points of the previous positions, ``[B, M, d_model]``.
      injection: their injections, ``[B, M, 3 H D_h]``.
      count: ``[B]`` int32, the valid slots of each row.
    """

    z: jax.Array
    injection: jax.Array
    count: jax.Array


class PositionwiseFF(nn.Module):
    """The feed-forward sub-block with its residual and layer norm (post or pre).

    Attributes:
      d_model: the state width.
      d_inner: the hidden width.
      dropout: variational dropout rate after each layer (mask shared by positions).
      pre_ln: normalise the input (torchdeq) instead of the output (locuslab).
      weight_norm: weight-normalise both layers.
      dtype: parameter and computation dtype.
    """

    d_model: int
    d_inner: int
    dropout: float = 0.0
    pre_ln: bool = False
    weight_norm: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, z: jax.Array) -> jax.Array:
        """``[B, L, d_model] -> [B, L, d_model]``."""
        wn = dict(use_bias=True, weight_norm=self.weight_norm, dtype=self.dtype)
        h = layer_norm(True, self.dtype, "ln_in")(z) if self.pre_ln else z
        h = nn.relu(dense(self.d_inner, name="ff1", **wn)(h))  # [B, L, d_inner]
        h = VariationalDropout(self.dropout, broadcast_dims=(1,), name="drop1")(h)
        h = dense(self.d_model, name="ff2", **wn)(h)  # [B, L, d]
        h = VariationalDropout(self.dropout, broadcast_dims=(1,), name="drop2")(h)
        if self.pre_ln:
            return z + h
        return layer_norm(False, self.dtype, "ln_out")(z + h)


class DEQTransformerCell(nn.Module):
    """``cell(z, x) -> z'``: relative self-attention over ``[memory, z]`` and a
    feed-forward block, the injection added to q, k, v (module docstring).

    Attributes:
      d_model: the state width.
      n_head: attention heads.
      d_head: width of each head.
      d_inner: the feed-forward hidden width.
      dropout: variational dropout rate inside the block.
      dropatt: dropout rate of the attention probabilities.
      ln_placement: ``"post"`` (locuslab) or ``"pre"`` (torchdeq).
      weight_norm: weight-normalise every projection of the block.
      dtype: parameter and computation dtype.

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """

    d_model: int
    n_head: int
    d_head: int
    d_inner: int
    dropout: float = 0.0
    dropatt: float = 0.0
    ln_placement: str = "post"
    weight_norm: bool = True
    dtype: Any = jnp.float32

    def __post_init__(self):
        if self.ln_placement not in LN_PLACEMENTS:
            raise ValueError(
                f"ln_placement must be one of {', '.join(LN_PLACEMENTS)}, got "
                f"{self.ln_placement!r}."
            )
        super().__post_init__()

    def state_spec(self, x: dict[str, Any]) -> jax.ShapeDtypeStruct:
        """``[B, L, d_model]`` for an injection ``x["injection"] [B, L, 3 H D_h]``."""
        b, q_len = x["injection"].shape[:2]
        return jax.ShapeDtypeStruct((b, q_len, self.d_model), jnp.dtype(self.dtype))

    def setup(self):
        pre_ln = self.ln_placement == "pre"
        self.attn = RelativeSelfAttention(
            self.d_model,
            self.n_head,
            self.d_head,
            dropout=self.dropout,
            dropatt=self.dropatt,
            pre_ln=pre_ln,
            weight_norm=self.weight_norm,
            dtype=self.dtype,
        )
        self.ff = PositionwiseFF(
            self.d_model,
            self.d_inner,
            dropout=self.dropout,
            pre_ln=pre_ln,
            weight_norm=self.weight_norm,
            dtype=self.dtype,
        )

    def prepare(self, x: dict[str, Any]) -> dict[str, Any]:
        """``x`` with the state-independent part of the cell added under ``"context"``
        (an `AttentionContext`: the memory's keys and values, the projected positions,
        the mask). `deq_jax.nn.DEQ` calls it once per solve and hands the result to
        every iteration; a call on an ``x`` without it prepares it first."""
        memory: Memory = x["memory"]
        q_len, mem_len = x["injection"].shape[1], memory.z.shape[1]
        mask = attention_mask(q_len, mem_len, memory.count)  # [B, L, M + L]
        injection = jnp.concatenate([memory.injection, x["injection"]], axis=1)  # [B, K, 3HD]
        context = self.attn.prepare(memory.z, injection, mask, q_len)
        return {**x, "context": context}

    def __call__(self, z: jax.Array, x: dict[str, Any]) -> jax.Array:
        """``z [B, L, d_model]``, ``x = {"injection", "memory"}`` (and, prepared,
        ``"context"``) -> ``z' [B, L, d_model]``."""
        if "context" not in x:
            x = self.prepare(x)
        return self.ff(self.attn(z, x["context"]))
