"""The language model's cell as it was before the speed work of issue 70 (commit
c8bbf2e), kept as the reference that `tests/test_lm_cell_equivalence.py` compares the
current cell with: same parameters, same outputs and gradients."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.language.attention import (
    _uniform_bias,
    attention_mask,
    rel_shift,
    sinusoid_positions,
)
from deq_jax.models.language.cell import LN_PLACEMENTS, Memory
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.norms import WeightNormDense


def dense(features: int, *, use_bias: bool, weight_norm: bool, dtype: Any, name: str) -> nn.Module:
    if weight_norm:
        return WeightNormDense(features, use_bias=use_bias, param_dtype=dtype, name=name)
    return nn.Dense(features, use_bias=use_bias, param_dtype=dtype, dtype=dtype, name=name)


def layer_norm(learnable: bool, dtype: Any, name: str) -> nn.Module:
    return nn.LayerNorm(
        use_scale=learnable, use_bias=learnable, dtype=dtype, param_dtype=dtype, name=name
    )


class ReferenceAttention(nn.Module):
    """The attention sub-block of a DEQ-Transformer cell, residual included.

    ``post`` (locuslab/deq): ``LN(z + drop(o(attn([mem, z]))))``, layer norms without
    parameters. ``pre`` (torchdeq's deq-lm): ``z + drop(o(LN(attn(LN([mem, z])))))``,
    learned layer norms. Dropout after the output projection is variational (one mask
    per row and feature, shared by the positions), ``dropatt`` drops attention
    probabilities (one mask per row, head, query and key); the relative position
    embeddings get a variational mask per feature. All masks come from the ``"dropout"``
    rng that the DEQ hands unchanged to every iteration.

    Attributes:
      d_model: the state width.
      n_head: heads ``H``.
      d_head: the width ``D_h`` of each head.
      dropout: rate of the output and position-embedding dropout.
      dropatt: rate of the attention-probability dropout.
      pre_ln: the pre-LN (torchdeq) block instead of the post-LN (locuslab) one.
      weight_norm: weight-normalise the q/k/v, position and output projections.
      dtype: parameter and computation dtype.

    References:
      Dai et al., "Transformer-XL", ACL 2019.
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """

    d_model: int
    n_head: int
    d_head: int
    dropout: float = 0.0
    dropatt: float = 0.0
    pre_ln: bool = False
    weight_norm: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self, z: jax.Array, mem: jax.Array, injection: jax.Array, mask: jax.Array
    ) -> jax.Array:
        """Attends from ``z`` to ``[mem, z]``.

        Args:
          z: the state, ``[B, L, d_model]``.
          mem: the memory states, ``[B, M, d_model]``.
          injection: the injection of ``[memory, segment]``, ``[B, M + L, 3 H D_h]``.
          mask: ``[B, L, M + L]`` bool (`attention_mask`).

        Returns:
          ``[B, L, d_model]``.
        """
        b, q_len, _ = z.shape
        h, dh = self.n_head, self.d_head
        wn = dict(weight_norm=self.weight_norm, dtype=self.dtype)
        cat = jnp.concatenate([mem.astype(z.dtype), z], axis=1)  # [B, K, d]
        k_len = cat.shape[1]
        if self.pre_ln:
            cat = layer_norm(True, self.dtype, "ln_in")(cat)
        heads = dense(3 * h * dh, use_bias=False, name="qkv", **wn)(cat) + injection  # [B, K, 3HD]
        heads = heads.reshape(b, k_len, 3, h, dh)
        q, k, v = heads[:, -q_len:, 0], heads[:, :, 1], heads[:, :, 2]  # [B, L|K, H, Dh]
        pos = sinusoid_positions(k_len, self.d_model, z.dtype)  # [K, d]
        pos = VariationalDropout(self.dropout, broadcast_dims=(0,), name="drop_pos")(pos)
        r = dense(h * dh, use_bias=False, name="r_net", **wn)(pos).reshape(k_len, h, dh)
        u_bias = self.param("r_w_bias", _uniform_bias, (h, dh), self.dtype)  # [H, Dh]
        v_bias = self.param("r_r_bias", _uniform_bias, (h, dh), self.dtype)  # [H, Dh]
        content = jnp.einsum("bihd,bjhd->bhij", q + u_bias, k)  # [B, H, L, K]
        position = rel_shift(jnp.einsum("bihd,jhd->bhij", q + v_bias, r))  # [B, H, L, K]
        scores = (content + position) / jnp.sqrt(jnp.asarray(dh, z.dtype))
        scores = jnp.where(mask[:, None], scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)  # [B, H, L, K]
        probs = VariationalDropout(self.dropatt, name="drop_att")(probs)
        vec = jnp.einsum("bhij,bjhd->bihd", probs, v).reshape(b, q_len, h * dh)  # [B, L, HD]
        if self.pre_ln:
            vec = layer_norm(True, self.dtype, "ln_vec")(vec)
        out = dense(self.d_model, use_bias=True, name="o_net", **wn)(vec)  # [B, L, d]
        out = VariationalDropout(self.dropout, broadcast_dims=(1,), name="drop_out")(out)
        if self.pre_ln:
            return z + out
        return layer_norm(False, self.dtype, "ln_out")(z + out)


class ReferenceFF(nn.Module):
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


class ReferenceCell(nn.Module):
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

    @nn.compact
    def __call__(self, z: jax.Array, x: dict[str, Any]) -> jax.Array:
        """``z [B, L, d_model]``, ``x = {"injection", "memory"}`` -> ``z' [B, L, d_model]``."""
        memory: Memory = x["memory"]
        q_len, mem_len = z.shape[1], memory.z.shape[1]
        pre_ln = self.ln_placement == "pre"
        mask = attention_mask(q_len, mem_len, memory.count)  # [B, L, M + L]
        injection = jnp.concatenate([memory.injection, x["injection"]], axis=1)  # [B, K, 3HD]
        z = ReferenceAttention(
            self.d_model,
            self.n_head,
            self.d_head,
            dropout=self.dropout,
            dropatt=self.dropatt,
            pre_ln=pre_ln,
            weight_norm=self.weight_norm,
            dtype=self.dtype,
            name="attn",
        )(z, memory.z, injection, mask)
        return ReferenceFF(
            self.d_model,
            self.d_inner,
            dropout=self.dropout,
            pre_ln=pre_ln,
            weight_norm=self.weight_norm,
            dtype=self.dtype,
            name="ff",
        )(z)
