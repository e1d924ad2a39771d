"""CLRS's losses of decoded features, per example.

`feature_loss`: squared error (scalar), binary cross-entropy (mask), cross-entropy over
nodes (mask_one, pointer) or classes (categorical), averaged over positions; the hint
loss of the ``fixed_steps`` mode (`deq_jax.models.clrs.loops`). The output's loss is the
task's (`deq_jax.models.clrs.task.ClrsTask.loss`).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/losses.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from deq_jax.models.clrs.encoders import FeatureSpec, dense_value


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
