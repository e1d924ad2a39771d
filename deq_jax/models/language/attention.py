"""Causal multi-head self-attention with Transformer-XL relative positions.

The queries are the current segment's ``L`` positions; the keys and values are the
``K = M + L`` positions of ``[memory, current segment]``. Scores follow Dai et al.
(2019), eq. (3)-(4) with learned biases ``u`` (``r_w_bias``) and ``v`` (``r_r_bias``):

    score[i, j] = (q_i + u) . k_j  +  (q_i + v) . W_r R[M + i - j]

where ``R[t]`` is the sinusoidal embedding of the distance ``t``. The second term is
computed for the distances ``K - 1, ..., 0`` once and moved into place by `rel_shift`.
Keys after the query (``j > M + i``) and memory slots not yet filled are masked out.

In a DEQ-Transformer the injection (a linear map of the token embeddings, ``3 H D_h``
wide) is added to the q, k, v projections of ``[memory, state]`` at every iteration
(Bai et al. 2019); this module takes it as an argument.

References:
  Dai, Yang, Yang, Carbonell, Le & Salakhutdinov, "Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context", ACL 2019.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the pre-LN
  cell of its deq-lm).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.norms import WeightNormDense


def sinusoid_positions(klen: int, d_model: int, dtype: Any = jnp.float32) -> jax.Array:
    """Sinusoidal embeddings of the distances ``klen - 1, ..., 1, 0``, ``[klen, d_model]``.

    Row ``c`` embeds the distance ``klen - 1 - c``: ``[sin(t w), cos(t w)]`` with the
    frequencies ``w_k = 10000^(-2k / d_model)`` (Vaswani et al. 2017).
    """
    distance = jnp.arange(klen - 1, -1, -1, dtype=dtype)  # [K]
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=dtype) / d_model))
    angles = distance[:, None] * inv_freq[None, :]  # [K, d/2]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [K, d]


def rel_shift(x: jax.Array) -> jax.Array:
    """Transformer-XL's relative shift, ``[..., L, K] -> [..., L, K]`` with ``K >= L``.

    If ``x[..., i, c]`` is a score against the distance ``K - 1 - c``, the result
    holds at ``[..., i, j]`` the score against the distance ``(K - L) + i - j`` (the
    distance from query ``i``, at key index ``K - L + i``, to key ``j``), for every
    ``j <= K - L + i``; the entries above that diagonal are garbage and must be masked.
    """
    *batch, q_len, k_len = x.shape
    padded = jnp.pad(x, [(0, 0)] * len(batch) + [(0, 0), (1, 0)])  # [..., L, K + 1]
    padded = padded.reshape(*batch, k_len + 1, q_len)[..., 1:, :]  # [..., K, L]
    return padded.reshape(*batch, q_len, k_len)


def attention_mask(q_len: int, mem_len: int, count: jax.Array) -> jax.Array:
    """``[B, L, M + L]`` bool, true where query ``i`` may attend to key ``j``.

    Key ``j < M`` is a memory slot, valid when it is one of the last ``count`` slots
    (memory is right-aligned: the most recent position sits in slot ``M - 1``); key
    ``M + t`` is the current position ``t``, visible to the queries ``i >= t``.

    Args:
      q_len: the segment length ``L``.
      mem_len: the memory length ``M``.
      count: ``[B]`` int, the valid memory slots of each row.
    """
    j = jnp.arange(mem_len + q_len)  # [K]
    i = jnp.arange(q_len)  # [L]
    causal = j[None, :] <= mem_len + i[:, None]  # [L, K]
    filled = j[None, :] >= mem_len - count[:, None]  # [B, K] (true for every j >= M)
    return causal[None] & filled[:, None, :]  # [B, L, K]


def _uniform_bias(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Uniform on ``[-0.05, 0.05)``, the initialisation of Transformer-XL's ``u`` and ``v``."""
    return jax.random.uniform(key, shape, dtype, -0.05, 0.05)


def dense(features: int, *, use_bias: bool, weight_norm: bool, dtype: Any, name: str) -> nn.Module:
    """A dense layer, weight-normalised (`deq_jax.nn.WeightNormDense`) or not."""
    if weight_norm:
        return WeightNormDense(features, use_bias=use_bias, param_dtype=dtype, name=name)
    return nn.Dense(features, use_bias=use_bias, param_dtype=dtype, dtype=dtype, name=name)


def layer_norm(learnable: bool, dtype: Any, name: str) -> nn.Module:
    """Layer norm with (torchdeq) or without (locuslab) a learned scale and bias."""
    return nn.LayerNorm(
        use_scale=learnable, use_bias=learnable, dtype=dtype, param_dtype=dtype, name=name
    )


class RelativeSelfAttention(nn.Module):
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
