"""CLRS's output scores, the metrics of `deq_jax.models.clrs.ClrsTask`; jittable (jnp,
batch axis first).

A pointer output scores the fraction of nodes whose predicted
parent is right, per graph, averaged over graphs (all graphs of a split have ``n``
nodes, so this equals CLRS's mean over all nodes); Kruskal's mask output scores the F1
of the predicted edges, computed from the true/false positive and false negative
counts. Both are reported as ``"score"``; the counts are reported per graph as well
(``"true_positives"``, ...), so `f1_from_counts` of the split's combined means gives
CLRS's F1 over the whole split when it spans several batches.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/evaluation.py``).
"""

from __future__ import annotations

import jax.numpy as jnp


def f1_from_counts(true_positives, false_positives, false_negatives):
    """CLRS's F1 from (summed or averaged) counts; numpy or jax, jittable.

    Precision is 1 without predicted positives, recall 1 without true positives, and
    F1 is 0 when both are 0 (``clrs/_src/evaluation.py``, ``_mask_fn``).
    """
    counts = (true_positives, false_positives, false_negatives)
    tp, fp, fn = (jnp.asarray(x, jnp.float32) for x in counts)
    precision = jnp.where(tp + fp > 0, tp / jnp.maximum(tp + fp, 1e-12), 1.0)
    recall = jnp.where(tp + fn > 0, tp / jnp.maximum(tp + fn, 1e-12), 1.0)
    total = precision + recall
    return jnp.where(total > 0, 2.0 * precision * recall / jnp.maximum(total, 1e-12), 0.0)


def _weights(mask, batch: int):
    return jnp.ones(batch) if mask is None else jnp.asarray(mask, jnp.float32)


def pointer_score(logits, targets, mask=None) -> dict:
    """CLRS's pointer accuracy: the fraction of nodes with the right parent.

    Args:
      logits: ``[B, n, n]``, row ``i`` the scores of ``i``'s parent.
      targets: int ``[B, n]``, the true parents.
      mask: optional ``[B]`` bool, which graphs count.

    Returns:
      ``{"score": mean over counted graphs of the per-graph accuracy, "count"}``.
    """
    if logits.ndim != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(
            f"Expected logits [B, n, n] and targets [B, n], got {logits.shape} and {targets.shape}."
        )
    right = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)  # [B, n]
    weight = _weights(mask, right.shape[0])
    count = jnp.sum(weight)
    return {"score": jnp.sum(weight * right.mean(axis=1)) / jnp.maximum(count, 1.0), "count": count}


def mask_score(logits, targets, mask=None) -> dict:
    """CLRS's mask score: the F1 of the predicted positives over the counted graphs.

    Args:
      logits: ``[B, ..., 2]`` two-class logits (class 1 predicted where it wins).
      targets: int ``[B, ...]`` 0/1.
      mask: optional ``[B]`` bool, which graphs count.

    Returns:
      ``{"score": F1 over every entry of the counted graphs, "true_positives",
      "false_positives", "false_negatives": per-graph means, "count"}``.
    """
    if logits.shape[:-1] != targets.shape or logits.shape[-1] != 2:
        raise ValueError(
            f"Expected logits [B, ..., 2] and targets [B, ...], got {logits.shape} and "
            f"{targets.shape}."
        )
    pred = jnp.argmax(logits, axis=-1) == 1
    truth = targets > 0
    axes = tuple(range(1, truth.ndim))
    weight = _weights(mask, truth.shape[0])
    count = jnp.maximum(jnp.sum(weight), 1.0)
    tp, fp, fn = (
        jnp.sum(weight * jnp.sum(x, axis=axes)) / count
        for x in (pred & truth, pred & ~truth, ~pred & truth)
    )
    return {
        "score": f1_from_counts(tp, fp, fn),
        "true_positives": tp,
        "false_positives": fp,
        "false_negatives": fn,
        "count": jnp.sum(weight),
    }
