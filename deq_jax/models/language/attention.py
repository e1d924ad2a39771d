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

Two ways to compute it, the same numbers (`attention_implementation` picks one per
call): written out (scores, `rel_shift`, mask, softmax, ``probs @ v``), which XLA:CPU
and float32 compile well; or fused, `jax.nn.dot_product_attention` with the shifted
position scores as its ``bias`` and the mask as its ``mask``, which on an NVIDIA GPU
runs cuDNN's flash-attention kernel when the cell computes in bfloat16.

References:
  Dai, Yang, Yang, Carbonell, Le & Salakhutdinov, "Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context", ACL 2019.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the pre-LN
  cell of its deq-lm).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp

from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.norms import WeightNormDense
from deq_jax.precision import current_precision

IMPLEMENTATIONS = ("unfused", "xla", "cudnn")


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


def dense(
    features: int, *, use_bias: bool, weight_norm: bool, dtype: Any, name: str | None = None
) -> nn.Module:
    """A dense layer, weight-normalised (`deq_jax.nn.WeightNormDense`) or not (``name``
    is left unset inside ``setup``, where the attribute names the layer)."""
    if weight_norm:
        return WeightNormDense(features, use_bias=use_bias, param_dtype=dtype, name=name)
    return nn.Dense(features, use_bias=use_bias, param_dtype=dtype, dtype=dtype, name=name)


def layer_norm(learnable: bool, dtype: Any, name: str | None = None) -> nn.Module:
    """Layer norm with (torchdeq) or without (locuslab) a learned scale and bias."""
    return nn.LayerNorm(
        use_scale=learnable, use_bias=learnable, dtype=dtype, param_dtype=dtype, name=name
    )


def unfused_on_cpu(x: jax.Array) -> jax.Array:
    """``x`` unchanged; on the CPU backend behind an optimisation barrier.

    XLA:CPU otherwise fuses the softmax into its matmul library's call for
    ``probs @ v`` as a prologue, which made that product cost about three times the
    softmax and the product apart inside a solver's loop (profiled with
    ``jax.profiler`` on the LM eval step, issue 70). Accelerators keep their own
    fusion decisions. The values are the same either way
    (`tests/test_lm_cell_equivalence.py`)."""
    if jax.default_backend() == "cpu":
        return jax.lax.optimization_barrier(x)
    return x


def platform() -> str:
    """The default backend's platform: ``"cuda"`` or ``"rocm"`` for a GPU, else
    `jax.default_backend` (``"cpu"``, ``"tpu"``)."""
    backend = jax.default_backend()
    if backend == "gpu":
        version = jax.extend.backend.get_backend().platform_version.lower()
        return "cuda" if "cuda" in version else "rocm"
    return backend


def attention_implementation(platform: str, precision: str, dropout_active: bool) -> str:
    """How `RelativeSelfAttention` computes a call: one of `IMPLEMENTATIONS`.

    ``"cudnn"`` (`jax.nn.dot_product_attention` on cuDNN's fused kernel) on an NVIDIA GPU
    when the cell computes in bfloat16 (the kernel takes bfloat16 or float16 operands
    only) and no attention probabilities are dropped (the kernel cannot apply the
    solve's fixed dropout mask); otherwise ``"unfused"``, the attention written out.
    ``"xla"``, the fused path on `jax.nn.dot_product_attention`'s XLA composition, is
    never chosen: it runs the fused path's code where cuDNN is absent (tests, on the CPU).

    Args:
      platform: `platform`'s answer (``"cuda"``, ``"rocm"``, ``"cpu"``, ``"tpu"``).
      precision: the cell's precision (`deq_jax.precision.current_precision`).
      dropout_active: whether this call drops attention probabilities.
    """
    if platform == "cuda" and precision == "bfloat16" and not dropout_active:
        return "cudnn"
    return "unfused"


class AttentionContext(NamedTuple):
    """What the attention reads that does not depend on the state: built once per solve
    by `RelativeSelfAttention.prepare`, read by every iteration.

    Attributes:
      k_mem: the memory's keys, injection added, ``[B, H, M, D_h]``.
      v_mem: the memory's values, injection added, transposed: ``[B, H, D_h, M]``.
      r: the projected (and dropped-out) relative positions, ``[B, H, K, D_h]`` (the
        same for every row: a batched product like the content scores' needs no
        transpose of its result).
      mask: ``[B, 1, L, K]`` bool (`attention_mask`).
      injection: the segment's injection, ``[B, L, 3 H D_h]``.
    """

    k_mem: jax.Array
    v_mem: jax.Array
    r: jax.Array
    mask: jax.Array
    injection: jax.Array


def _heads(x: jax.Array, n_head: int, d_head: int) -> tuple[jax.Array, ...]:
    """``[B, T, 3 H D_h] -> (q, k, v)``, each ``[B, H, T, D_h]``."""
    b, t, _ = x.shape
    x = x.reshape(b, t, 3, n_head, d_head)
    return tuple(jnp.transpose(x[:, :, i], (0, 2, 1, 3)) for i in range(3))


class RelativeSelfAttention(nn.Module):
    """The attention sub-block of a DEQ-Transformer cell, residual included.

    ``post`` (locuslab/deq): ``LN(z + drop(o(attn([mem, z]))))``, layer norms without
    parameters. ``pre`` (torchdeq's deq-lm): ``z + drop(o(LN(attn(LN([mem, z])))))``,
    learned layer norms. Dropout after the output projection is variational (one mask
    per row and feature, shared by the positions), ``dropatt`` drops attention
    probabilities (one mask per row, head, query and key); the relative position
    embeddings get a variational mask per feature. All masks come from the ``"dropout"``
    rng that the DEQ hands unchanged to every iteration.

    What does not depend on the state (the memory's keys and values, the projected
    positions, the mask) is computed by `prepare` once per solve (`deq_jax.nn.DEQ`
    calls it before the solver's loop); ``__call__`` computes q, k, v of the ``L``
    current positions only.

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

    def setup(self):
        h, dh = self.n_head, self.d_head
        wn = dict(weight_norm=self.weight_norm, dtype=self.dtype)
        if self.pre_ln:
            self.ln_in = layer_norm(True, self.dtype)
            self.ln_vec = layer_norm(True, self.dtype)
        else:
            self.ln_out = layer_norm(False, self.dtype)
        self.qkv = dense(3 * h * dh, use_bias=False, **wn)
        self.drop_pos = VariationalDropout(self.dropout, broadcast_dims=(0,))
        self.r_net = dense(h * dh, use_bias=False, **wn)
        self.r_w_bias = self.param("r_w_bias", _uniform_bias, (h, dh), self.dtype)  # [H, Dh]
        self.r_r_bias = self.param("r_r_bias", _uniform_bias, (h, dh), self.dtype)  # [H, Dh]
        self.drop_att = VariationalDropout(self.dropatt)
        self.o_net = dense(self.d_model, use_bias=True, **wn)
        self.drop_out = VariationalDropout(self.dropout, broadcast_dims=(1,))

    def prepare(
        self, mem: jax.Array, injection: jax.Array, mask: jax.Array, q_len: int
    ) -> AttentionContext:
        """The state-independent part of the block (`AttentionContext`).

        Args:
          mem: the memory states, ``[B, M, d_model]``.
          injection: the injection of ``[memory, segment]``, ``[B, M + L, 3 H D_h]``.
          mask: ``[B, L, M + L]`` bool (`attention_mask`).
          q_len: the segment length ``L``.
        """
        mem_len = mem.shape[1]
        k_len = mem_len + q_len
        h, dh = self.n_head, self.d_head
        mem = self.ln_in(mem) if self.pre_ln else mem
        _, k_mem, v_mem = _heads(self.qkv(mem) + injection[:, :mem_len], h, dh)
        v_mem = jnp.swapaxes(v_mem, 2, 3)  # [B, H, Dh, M]
        pos = self.drop_pos(sinusoid_positions(k_len, self.d_model, injection.dtype))  # [K, d]
        r = self.r_net(pos).reshape(k_len, h, dh).transpose(1, 0, 2)  # [H, K, Dh]
        r = jnp.broadcast_to(r, (mem.shape[0], *r.shape))  # [B, H, K, Dh]
        return AttentionContext(k_mem, v_mem, r, mask[:, None], injection[:, mem_len:])

    def __call__(self, z: jax.Array, context: AttentionContext) -> jax.Array:
        """Attends from ``z [B, L, d_model]`` to ``[mem, z]``; returns ``[B, L, d_model]``.

        The implementation is `attention_implementation`'s for this backend, the cell's
        precision and whether attention dropout is active."""
        b, q_len, _ = z.shape
        qkv = self.qkv(self.ln_in(z) if self.pre_ln else z) + context.injection  # [B, L, 3HD]
        dropout_active = self.dropatt > 0.0 and self.has_rng("dropout")
        implementation = attention_implementation(platform(), current_precision(), dropout_active)
        if implementation == "unfused":
            vec = self._unfused(qkv, context)
        else:
            vec = self._fused(qkv, context, implementation)
        vec = vec.reshape(b, q_len, self.n_head * self.d_head)  # [B, L, HD]
        if self.pre_ln:
            vec = self.ln_vec(vec)
        out = self.drop_out(self.o_net(vec))  # [B, L, d]
        if self.pre_ln:
            return z + out
        return self.ln_out(z + out)

    def _unfused(self, qkv: jax.Array, context: AttentionContext) -> jax.Array:
        """The attention of ``qkv [B, L, 3 H D_h]`` written out; ``[B, L, H, D_h]``."""
        dh = self.d_head
        q, k, v = _heads(qkv, self.n_head, dh)
        k = jnp.concatenate([context.k_mem, k], axis=2)  # [B, H, K, Dh]
        # values transposed: both operands of probs @ v contract their last axis, the
        # form XLA's CPU backend hands to its fast matmul library
        v = jnp.concatenate([context.v_mem, jnp.swapaxes(v, 2, 3)], axis=3)  # [B, H, Dh, K]
        content = jnp.einsum("bhid,bhjd->bhij", q + self.r_w_bias[:, None], k)  # [B, H, L, K]
        position = jnp.einsum("bhid,bhjd->bhij", q + self.r_r_bias[:, None], context.r)
        scores = (content + rel_shift(position)) / jnp.sqrt(jnp.asarray(dh, qkv.dtype))
        scores = jnp.where(context.mask, scores, jnp.finfo(scores.dtype).min)
        probs = self.drop_att(jax.nn.softmax(scores, axis=-1))  # [B, H, L, K]
        probs = unfused_on_cpu(probs)
        return jnp.einsum("bhij,bhdj->bihd", probs, v)

    def _fused(self, qkv: jax.Array, context: AttentionContext, implementation: str) -> jax.Array:
        """The attention of ``qkv [B, L, 3 H D_h]`` by `jax.nn.dot_product_attention`
        (``implementation`` ``"cudnn"`` or ``"xla"``): the content scores in its kernel,
        the shifted position scores its ``bias``; ``[B, L, H, D_h]`` in ``qkv``'s dtype.

        In bfloat16 precision the kernel's operands, the position scores' product and
        its output (the bias) are bfloat16 (cuDNN's kernel and the GPU's matmuls
        accumulate in float32); in any other, the dtype of ``qkv``. Attention dropout
        is not applied: `attention_implementation` never picks a fused kernel while it
        is active."""
        b, q_len, _ = qkv.shape
        h, dh = self.n_head, self.d_head
        dtype = jnp.bfloat16 if current_precision() == "bfloat16" else qkv.dtype
        scale = 1.0 / float(dh) ** 0.5
        qkv = qkv.reshape(b, q_len, 3, h, dh)
        q, k, v = (qkv[:, :, i] for i in range(3))  # each [B, L, H, Dh]
        # the scale on the queries: the product's output, in dtype, is the bias
        position = jnp.einsum(
            "bihd,bhjd->bhij",
            ((q + self.r_r_bias) * scale).astype(dtype),
            context.r.astype(dtype),
        )  # [B, H, L, K]
        keys = jnp.concatenate([jnp.swapaxes(context.k_mem, 1, 2), k], axis=1)  # [B, K, H, Dh]
        values = jnp.concatenate([jnp.moveaxis(context.v_mem, 3, 1), v], axis=1)  # [B, K, H, Dh]
        out = jax.nn.dot_product_attention(
            (q + self.r_w_bias).astype(dtype),
            keys.astype(dtype),
            values.astype(dtype),
            bias=rel_shift(position),
            mask=context.mask,
            scale=scale,
            implementation=implementation,
        )  # [B, L, H, Dh]
        return out.astype(q.dtype)
