"""Encoders, decoders, losses and hint feedback of CLRS features, one per type.

A CLRS algorithm describes every probe by ``(name, stage, location, type)``; a
`FeatureSpec` adds the number of classes of a categorical feature. The modules here
are built from a tuple of them, so the layer knows nothing of any task:

* `FeatureEncoder`: one linear map per feature to ``H`` channels, summed into node
  ``[B, n, H]``, edge ``[B, n, n, H]`` and graph ``[B, H]`` embeddings. Scalars and
  masks are encoded from ``x[..., None]``, categorical features from their one-hot
  ``[..., K]``, and node pointers as one-hot *edge* features (``p[:, i, j] = 1`` where
  ``i`` points to ``j``), as in CLRS.
* `FeatureDecoder`: logits per feature from node embeddings ``h [B, n, F]``, edge and
  graph embeddings. A node pointer's logits are ``s_ij = w^T max(P_1 h_i, P_2 h_j +
  P_e e_ji)`` ``[B, n, n]``, a softmax over ``j`` per node ``i`` (CLRS's decoder); an
  edge feature is ``D_1 h_i + D_2 h_j + D_e e_ij``; a graph feature reads the max over
  nodes.
* `feature_loss`: CLRS's losses per example ``[B]``: squared error (scalar), binary
  cross-entropy (mask), cross-entropy over nodes (mask_one, pointer) or classes
  (categorical), averaged over positions.
* `feedback`: a decoded hint turned back into an encoder input: ``"soft"`` (sigmoid or
  softmax, CLRS's default), ``"hard"`` (threshold or one-hot argmax) or ``"gumbel"``
  (straight-through Gumbel-softmax: a one-hot sample forward, the softmax's gradient
  backward; binary features use the logistic analogue).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/encoders.py``, ``decoders.py``, ``losses.py``).
  Jang, Gu & Poole, "Categorical Reparameterization with Gumbel-Softmax", ICLR 2017.
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024 blog
  post track (Gumbel-softmax for categorical hints).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from deq_jax.models.clrs.processors import max_reduce

STAGES = ("input", "output", "hint")
LOCATIONS = ("node", "edge", "graph")
TYPES = ("scalar", "categorical", "mask", "mask_one", "pointer")
FEEDBACK = ("soft", "hard", "gumbel")


class FeatureSpec(NamedTuple):
    """One CLRS feature.

    Attributes:
      name: the feature's name (e.g. ``"pi"``).
      stage: ``"input"``, ``"output"`` or ``"hint"``.
      location: ``"node"``, ``"edge"`` or ``"graph"``.
      type: ``"scalar"``, ``"categorical"``, ``"mask"``, ``"mask_one"`` or ``"pointer"``.
      categories: classes of a categorical feature (0 otherwise).
    """

    name: str
    stage: str
    location: str
    type: str
    categories: int = 0


class Embeddings(NamedTuple):
    """Summed feature encodings: node ``[B, n, H]``, edge ``[B, n, n, H]``, graph ``[B, H]``."""

    node: jax.Array
    edge: jax.Array
    graph: jax.Array

    def plus(self, other: Embeddings) -> Embeddings:
        """The sum of two embeddings, part by part."""
        return Embeddings(self.node + other.node, self.edge + other.edge, self.graph + other.graph)


def parse_spec(rows: Iterable[Any]) -> tuple[FeatureSpec, ...]:
    """Checks ``(name, stage, location, type[, categories])`` rows; returns `FeatureSpec`s.

    Raises:
      ValueError: for an unknown stage, location or type (listing the valid ones), a
        categorical feature without classes, a pointer off the nodes or a repeated name
        within a stage.
    """
    out, seen = [], set()
    for row in rows:
        feature = FeatureSpec(*row)
        for field, valid in (("stage", STAGES), ("location", LOCATIONS), ("type", TYPES)):
            if getattr(feature, field) not in valid:
                raise ValueError(
                    f"Feature {feature.name!r} has {field} {getattr(feature, field)!r}; valid: "
                    f"{', '.join(valid)}."
                )
        if (feature.type == "categorical") != (feature.categories > 0):
            raise ValueError(f"Only categorical features have categories > 0: {feature}.")
        if feature.type == "pointer" and feature.location != "node":
            raise ValueError(f"Only node pointers are supported, got {feature}.")
        if (feature.stage, feature.name) in seen:
            raise ValueError(f"Feature {feature.name!r} appears twice at stage {feature.stage}.")
        seen.add((feature.stage, feature.name))
        out.append(feature)
    return tuple(out)


def of_stage(spec: Iterable[FeatureSpec], stage: str) -> tuple[FeatureSpec, ...]:
    """The features of ``stage``, in spec order."""
    return tuple(f for f in spec if f.stage == stage)


def feature_shape(feature: FeatureSpec, num_nodes: int) -> tuple[int, ...]:
    """Per-example shape of a feature's data (pointers: int node indices ``[n]``)."""
    shape = {"node": (num_nodes,), "edge": (num_nodes, num_nodes), "graph": ()}[feature.location]
    return shape + ((feature.categories,) if feature.type == "categorical" else ())


def dense_value(feature: FeatureSpec, value: jax.Array, num_nodes: int) -> jax.Array:
    """A feature as floats: an integer pointer becomes its one-hot ``[..., n]``; a
    float pointer (a distribution over nodes, e.g. fed back) and the rest pass through."""
    if feature.type == "pointer" and jnp.issubdtype(value.dtype, jnp.integer):
        return jax.nn.one_hot(value, num_nodes, dtype=jnp.float32)
    return value.astype(jnp.float32)


class FeatureEncoder(nn.Module):
    """Linear encoders per feature, summed into node, edge and graph embeddings.

    Attributes:
      features: the features to encode, each with its own ``Dense`` (``encode_<name>``).
      hidden: the embedding width ``H``.
    """

    features: tuple[FeatureSpec, ...]
    hidden: int

    @nn.compact
    def __call__(self, values: Mapping[str, jax.Array], batch: int, num_nodes: int) -> Embeddings:
        """``values[name]`` (batch axis first, see `feature_shape`) -> `Embeddings`."""
        h, n = self.hidden, num_nodes
        node = jnp.zeros((batch, n, h))
        edge = jnp.zeros((batch, n, n, h))
        graph = jnp.zeros((batch, h))
        for feature in self.features:
            x = dense_value(feature, values[feature.name], n)
            if feature.type != "categorical":
                x = x[..., None]
            encoded = nn.Dense(h, name=f"encode_{feature.name}")(x)
            if feature.location == "edge" or feature.type == "pointer":
                edge = edge + encoded  # [B, n, n, H]
            elif feature.location == "node":
                node = node + encoded  # [B, n, H]
            else:
                graph = graph + encoded  # [B, H]
        return Embeddings(node, edge, graph)


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


def feature_loss(feature: FeatureSpec, logits: jax.Array, truth: jax.Array) -> jax.Array:
    """CLRS's loss of one feature per example ``[B]``, averaged over its positions.

    Args:
      feature: the feature.
      logits: the decoder's logits (see `FeatureDecoder`).
      truth: the target data (pointers as int node indices or distributions).

    Returns:
      ``[B]``: squared error (scalar), binary cross-entropy (mask), cross-entropy over
      the last axis (mask_one over nodes, pointer over nodes, categorical over classes).
    """
    num_nodes = logits.shape[-1]
    target = dense_value(feature, truth, num_nodes)
    if feature.type == "scalar":
        per_position = jnp.square(logits - target)
    elif feature.type == "mask":
        per_position = optax.sigmoid_binary_cross_entropy(logits, target)
    else:
        per_position = -jnp.sum(target * jax.nn.log_softmax(logits, axis=-1), axis=-1)
    return per_position.reshape(per_position.shape[0], -1).mean(axis=1)


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
