"""Adaptive input embeddings and the adaptive softmax, with tied weights.

The vocabulary (sorted by frequency) is split by ``cutoffs`` into a head
``[0, c_1)`` and tail clusters ``[c_1, c_2), ..., [c_k, V)``. Cluster ``i`` has its own
embedding table of width ``d_embed // div_val**i`` and a projection to ``d_model``, so
rare words get fewer parameters (Baevski & Auli 2019). The adaptive softmax
(Grave et al. 2017) scores the head words plus one logit per tail cluster; a tail word's
log-probability is its cluster's head log-probability plus its log-probability within
the cluster. With ``tie_weights`` the softmax reuses each cluster's embedding table and
projection (Transformer-XL's ``tie_weight`` and ``tie_projs``); each output word keeps
a bias. ``cutoffs=()`` is a plain (tied) embedding and softmax; with ``div_val=1`` all
clusters share one table of width ``d_embed``.

Token ids are checked in `deq_jax.models.language.DEQTransformerLM` where the tokens
are concrete; under ``jit`` an id outside ``[0, V)`` embeds as NaN and a target outside
it has a NaN log-probability, so a bad id can never pass unnoticed.

References:
  Baevski & Auli, "Adaptive Input Representations for Neural Language Modeling",
  ICLR 2019.
  Grave, Joulin, Cissé, Grangier & Jégou, "Efficient softmax approximation for GPUs",
  ICML 2017.
  Dai et al., "Transformer-XL", ACL 2019.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

_EMBED_INIT = nn.initializers.normal(0.02)


def check_cutoffs(vocab_size: int, cutoffs: tuple[int, ...], div_val: int) -> None:
    """Raises a ValueError unless ``0 < c_1 < ... < c_k < vocab_size`` and ``div_val >= 1``."""
    bounds = (0, *cutoffs, vocab_size)
    if any(lo >= hi for lo, hi in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(
            f"cutoffs must increase strictly inside (0, vocab_size={vocab_size}), got {cutoffs!r}."
        )
    if not isinstance(div_val, int) or div_val < 1:
        raise ValueError(f"div_val must be an integer >= 1, got {div_val!r}.")


class AdaptiveIO(nn.Module):
    """The embedding (`embed`) and the softmax (`log_probs`, `nll`) of a language model.

    Parameters: ``emb_i`` (``[n_i, d_i]``, or one ``emb_0 [V, d_embed]`` when
    ``div_val == 1``), ``emb_proj_i`` (``[d_i, d_model]``, only where ``d_i !=
    d_model``), ``out_bias`` (``[V]``), ``cluster_weight`` and ``cluster_bias`` (the
    tail clusters' head logits, when there are cutoffs), and without ``tie_weights``
    the softmax's own ``out_i`` and ``out_proj_i``.

    Attributes:
      vocab_size: ``V``.
      d_model: the model width (embedding output, softmax input).
      cutoffs: the cluster boundaries, increasing, inside ``(0, V)``.
      div_val: each cluster's embedding is ``div_val`` times narrower than the last.
      tie_weights: share tables and projections between embedding and softmax.
      d_embed: the head cluster's embedding width (``None``: ``d_model``).
      dtype: parameter and computation dtype.

    References:
      Baevski & Auli, "Adaptive Input Representations", ICLR 2019.
      Grave et al., "Efficient softmax approximation for GPUs", ICML 2017.
    """

    vocab_size: int
    d_model: int
    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    tie_weights: bool = True
    d_embed: int | None = None
    dtype: Any = jnp.float32

    def setup(self):
        check_cutoffs(self.vocab_size, tuple(self.cutoffs), self.div_val)
        self.bounds = (0, *self.cutoffs, self.vocab_size)
        d_embed = self.d_model if self.d_embed is None else self.d_embed
        n_clusters = len(self.bounds) - 1
        widths = [d_embed // self.div_val**i for i in range(n_clusters)]
        if min(widths) < 1:
            raise ValueError(f"div_val={self.div_val} leaves a cluster an embedding width < 1.")
        self.widths = widths

        def tables(prefix: str) -> tuple[list[jax.Array], list[jax.Array | None]]:
            if self.div_val == 1:
                full = self.param(
                    f"{prefix}_0", _EMBED_INIT, (self.vocab_size, d_embed), self.dtype
                )
                parts = [full[lo:hi] for lo, hi in zip(self.bounds, self.bounds[1:], strict=False)]
                proj = self._proj(f"{prefix}_proj_0", d_embed)
                return parts, [proj] * n_clusters
            sizes = [hi - lo for lo, hi in zip(self.bounds, self.bounds[1:], strict=False)]
            parts = [
                self.param(f"{prefix}_{i}", _EMBED_INIT, (n, w), self.dtype)
                for i, (n, w) in enumerate(zip(sizes, widths, strict=True))
            ]
            projs = [self._proj(f"{prefix}_proj_{i}", w) for i, w in enumerate(widths)]
            return parts, projs

        self.emb, self.emb_proj = tables("emb")
        self.out, self.out_proj = (self.emb, self.emb_proj) if self.tie_weights else tables("out")
        zeros = nn.initializers.zeros
        self.out_bias = self.param("out_bias", zeros, (self.vocab_size,), self.dtype)
        if n_clusters > 1:
            shape = (n_clusters - 1, widths[0])
            self.cluster_weight = self.param("cluster_weight", zeros, shape, self.dtype)
            self.cluster_bias = self.param("cluster_bias", zeros, (n_clusters - 1,), self.dtype)

    def _proj(self, name: str, width: int) -> jax.Array | None:
        if width == self.d_model:
            return None
        init = nn.initializers.lecun_normal()
        return self.param(name, init, (width, self.d_model), self.dtype)

    def embed(self, tokens: jax.Array) -> jax.Array:
        """``tokens [B, L]`` int -> ``[B, L, d_model]``, scaled by ``sqrt(d_model)``.

        An id outside ``[0, V)`` embeds as NaN.
        """
        out = jnp.full((*tokens.shape, self.d_model), jnp.nan, self.dtype)
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:], strict=False)):
            inside = (tokens >= lo) & (tokens < hi)  # [B, L]
            e = jnp.take(self.emb[i], jnp.clip(tokens - lo, 0, hi - lo - 1), axis=0)
            if self.emb_proj[i] is not None:
                e = e @ self.emb_proj[i]  # [B, L, d_model]
            out = jnp.where(inside[..., None], e, out)
        return out * jnp.sqrt(jnp.asarray(self.d_model, self.dtype))

    def _cluster_log_probs(self, h: jax.Array) -> list[jax.Array]:
        """Log-softmax of the head (with the cluster logits last) and of each tail."""
        out = []
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:], strict=False)):
            weight, bias = self.out[i], self.out_bias[lo:hi]
            if i == 0 and len(self.bounds) > 2:
                weight = jnp.concatenate([weight, self.cluster_weight], axis=0)
                bias = jnp.concatenate([bias, self.cluster_bias], axis=0)
            hi_ = h if self.out_proj[i] is None else h @ self.out_proj[i].T  # [..., d_i]
            out.append(jax.nn.log_softmax(hi_ @ weight.T + bias, axis=-1))
        return out

    def log_probs(self, h: jax.Array) -> jax.Array:
        """``h [..., d_model] -> [..., V]``, normalised log-probabilities of every word."""
        head, *tails = self._cluster_log_probs(h)
        shortlist = self.bounds[1]
        parts = [head[..., :shortlist]]
        for c, tail in enumerate(tails):
            parts.append(head[..., shortlist + c, None] + tail)
        return jnp.concatenate(parts, axis=-1)

    def nll(self, h: jax.Array, targets: jax.Array) -> jax.Array:
        """``-log p(targets)``: ``h [..., d_model]``, ``targets [...]`` int -> ``[...]``.

        A target outside ``[0, V)`` gets NaN.
        """
        head, *tails = self._cluster_log_probs(h)
        shortlist = self.bounds[1]
        out = jnp.full(targets.shape, jnp.nan, head.dtype)
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:], strict=False)):
            index = jnp.clip(targets - lo, 0, hi - lo - 1)[..., None]
            if i == 0:
                lp = jnp.take_along_axis(head, index, axis=-1)[..., 0]
            else:
                lp = head[..., shortlist + i - 1]
                lp = lp + jnp.take_along_axis(tails[i - 1], index, axis=-1)[..., 0]
            out = jnp.where((targets >= lo) & (targets < hi), -lp, out)
        return out
