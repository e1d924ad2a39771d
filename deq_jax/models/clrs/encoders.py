"""Encoders of CLRS features, one per type, and the feature specs they are built from.

A CLRS algorithm describes every probe by ``(name, stage, location, type)``; a
`FeatureSpec` adds the number of classes of a categorical feature. The modules of the
model (this one, `deq_jax.models.clrs.decoders`, `deq_jax.models.clrs.losses`) are
built from a tuple of them, so they know nothing of any task.

`FeatureEncoder`: one linear map per feature to ``H`` channels, summed into node
``[B, n, H]``, edge ``[B, n, n, H]`` and graph ``[B, H]`` embeddings. Scalars and masks
are encoded from ``x[..., None]``, categorical features from their one-hot ``[..., K]``,
and node pointers as one-hot *edge* features (``p[:, i, j] = 1`` where ``i`` points to
``j``), as in CLRS.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/encoders.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

STAGES = ("input", "output", "hint")
LOCATIONS = ("node", "edge", "graph")
TYPES = ("scalar", "categorical", "mask", "mask_one", "pointer")


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
