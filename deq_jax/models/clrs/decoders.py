"""Decoders of CLRS features and the feedback of decoded hints into the encoders.

* `FeatureDecoder`: logits per feature from node embeddings ``h [B, n, F]``, edge and
  graph embeddings. A node pointer's logits are ``s_ij = w^T max(P_1 h_i, P_2 h_j +
  P_e e_ji)`` ``[B, n, n]``, a softmax over ``j`` per node ``i`` (CLRS's decoder); an
  edge feature is ``D_1 h_i + D_2 h_j + D_e e_ij``; a graph feature reads the max over
  nodes.
* `feedback`: a decoded hint turned back into an encoder input: ``"soft"`` (sigmoid or
  softmax, CLRS's default), ``"hard"`` (threshold or one-hot argmax) or ``"gumbel"``
  (straight-through Gumbel-softmax: a one-hot sample forward, the softmax's gradient
  backward; binary features use the logistic analogue).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/decoders.py``).
  Jang, Gu & Poole, "Categorical Reparameterization with Gumbel-Softmax", ICLR 2017.
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024 blog
  post track (Gumbel-softmax for categorical hints).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.clrs.encoders import FeatureSpec
from deq_jax.models.clrs.processors import max_reduce

FEEDBACK = ("soft", "hard", "gumbel")


class FeatureDecoder(nn.Module):
    """Logits per feature from node, edge and graph embeddings (see module docstring).

    Attributes:
      features: the features to decode.
      hidden: the width of the pointer decoder's hidden layer.
    """

    features: tuple[FeatureSpec, ...]
    hidden: int

    @nn.compact
    def __call__(self, h: jax.Array, edge: jax.Array, graph: jax.Array) -> dict[str, jax.Array]:
        """``h [B, n, F], edge [B, n, n, H], graph [B, H] -> {name: logits}``.

        Logits: node ``[B, n]`` (``[B, n, K]`` categorical, ``[B, n, n]`` pointer), edge
        ``[B, n, n]`` (``[B, n, n, K]``), graph ``[B]`` (``[B, K]``).
        """
        out = {}
        for f in self.features:
            width = f.categories or 1
            dense = lambda features, part, f=f: nn.Dense(features, name=f"decode_{f.name}_{part}")
            if f.type == "pointer":
                p_from = dense(self.hidden, "from")(h)  # [B, n, D]
                p_to = dense(self.hidden, "to")(h)  # [B, n, D]
                p_edge = dense(self.hidden, "edge")(edge)  # [B, n, n, D]
                to_j = p_to[:, None, :] + jnp.swapaxes(p_edge, 1, 2)  # [B, i, j]: to_j + e_ji
                logits = dense(1, "out")(jnp.maximum(p_from[:, :, None], to_j))[..., 0]
            elif f.location == "node":
                logits = dense(width, "node")(h)  # [B, n, K]
            elif f.location == "edge":
                logits = (
                    dense(width, "from")(h)[:, :, None]
                    + dense(width, "to")(h)[:, None, :]
                    + dense(width, "edge")(edge)
                )  # [B, n, n, K]
            else:
                logits = dense(width, "nodes")(max_reduce(h, 1)) + dense(width, "graph")(graph)
            if f.type != "categorical" and f.type != "pointer":
                logits = logits[..., 0]
            out[f.name] = logits
        return out


def feedback(
    feature: FeatureSpec,
    logits: jax.Array,
    mode: str = "soft",
    key: jax.Array | None = None,
    tau: float = 1.0,
) -> jax.Array:
    """A decoded hint as an encoder input (see the module docstring).

    Args:
      feature: the feature.
      logits: its logits.
      mode: ``"soft"``, ``"hard"`` or ``"gumbel"`` (scalars always pass through).
      key: the Gumbel noise key (``"gumbel"`` only).
      tau: the Gumbel-softmax temperature.

    Returns:
      Floats shaped like `dense_value` of the feature (pointers ``[B, n, n]``).

    References:
      Jang, Gu & Poole, "Categorical Reparameterization with Gumbel-Softmax", ICLR 2017.
    """
    if mode not in FEEDBACK:
        raise ValueError(f"Unknown feedback mode {mode!r}. Valid modes: {', '.join(FEEDBACK)}.")
    if feature.type == "scalar":
        return logits
    binary = feature.type == "mask"
    if mode == "gumbel":
        if key is None:
            raise ValueError("Gumbel feedback needs a key.")
        if binary:  # the difference of two Gumbels is logistic
            logits = logits + jax.random.logistic(key, logits.shape, logits.dtype)
        else:
            logits = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
        logits = logits / tau
    soft = jax.nn.sigmoid(logits) if binary else jax.nn.softmax(logits, axis=-1)
    if mode == "soft":
        return soft
    if binary:
        hard = (logits > 0).astype(soft.dtype)
    else:
        hard = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=soft.dtype)
    if mode == "hard":
        return hard
    return hard + soft - jax.lax.stop_gradient(soft)  # straight-through
