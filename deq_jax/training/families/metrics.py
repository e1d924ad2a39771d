"""Losses and metrics of a DEQ's train and eval steps, over the real examples.

``mask [B]`` marks real (not padding) examples everywhere: padding rows count for
nothing. `combine` joins per-batch eval metrics (weighted by their ``count``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from deq_jax.regularizers.terms import Term
from deq_jax.solvers.base import SolverStats


def classification_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean cross-entropy over every label of the real examples.

    Args:
      logits: ``[B, ..., C]``.
      targets: integer labels ``[B, ...]``.
      mask: ``[B]`` bool, false for padding rows.

    Returns:
      A scalar; padding rows count for nothing.
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # [B, ...]
    return masked_mean(ce.reshape(ce.shape[0], -1).mean(axis=1), mask)


def regression_loss(outputs: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean squared error over every output of the real examples.

    Args:
      outputs: ``[B, ...]`` predictions.
      targets: ``[B, ...]``, the same shape.
      mask: ``[B]`` bool, false for padding rows.

    Returns:
      A scalar; padding rows count for nothing.
    """
    err = jnp.square(outputs - targets.astype(outputs.dtype))  # [B, ...]
    return masked_mean(err.reshape(err.shape[0], -1).mean(axis=1), mask)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of ``values [B]`` over the real examples (``mask [B]``)."""
    w = mask.astype(values.dtype)
    return jnp.sum(values * w) / jnp.maximum(jnp.sum(w), 1.0)


def is_regression(task: Any) -> bool:
    """Whether ``task`` is a regression task (``num_classes`` is ``None``)."""
    return getattr(task, "num_classes", None) is None


def solver_metrics(stats: SolverStats, mask: jax.Array) -> dict[str, jax.Array]:
    """Means (and the max of ``nstep``) of the solver statistics over real examples;
    with a measured residual floor, its mean (``floor``) and the share of samples that
    stopped on it (``at_floor``)."""
    mean = lambda x: masked_mean(jnp.asarray(x, jnp.float32), mask)
    finite = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
    metrics = {
        "nstep_mean": mean(stats.nstep),
        "nstep_max": jnp.max(jnp.where(mask, stats.nstep, 0)),
        "abs_residual": mean(finite(stats.abs_residual)),
        "rel_residual": mean(finite(stats.rel_residual)),
        "converged": mean(stats.converged),
        "diverged": mean(stats.diverged),
    }
    if stats.floor is not None:  # a reduced-precision cell's residual floor
        metrics["floor"] = mean(finite(stats.floor))
        metrics["at_floor"] = mean(stats.at_floor)
    return metrics


def sown(intermediates: Mapping[str, Any], name: str, required: bool = True) -> jax.Array | None:
    """Every value sown as ``name`` (e.g. by each DEQ of a model), ``[B]`` summed.

    Returns ``None`` when nothing was sown as ``name`` and ``required`` is false.
    """
    flat = traverse_util.flatten_dict(dict(intermediates))
    values = [v for path, tup in flat.items() if path[-1] == name for v in tup]
    if not values:
        if not required:
            return None
        raise ValueError(f"The model sowed no {name!r}; its DEQ must receive the option.")
    return sum(values[1:], values[0])


def term_values(
    intermediates: Mapping[str, Any], terms: tuple[Term, ...], mask: jax.Array, dtype: Any
) -> dict[str, jax.Array]:
    """The mean over the real examples of every value ``terms`` sow (`Term.outputs`), NaN
    for a term this model variant does not carry (e.g. the Jacobian term on a skipped
    step), so every branch of the step returns the same metrics."""
    values = {}
    for term in terms:
        for name in term.outputs:
            value = sown(intermediates, name, required=False)
            values[name] = (
                jnp.full((), jnp.nan, dtype) if value is None else masked_mean(value, mask)
            )
    return values


def combine(batches: list[Mapping[str, Any]]) -> dict[str, float]:
    """Combines per-batch eval metrics: ``*_max`` by max, ``count`` by sum, others by
    the mean weighted with ``count``."""
    counts = [float(b["count"]) for b in batches]
    total = sum(counts)
    out: dict[str, float] = {"count": total}
    for key in batches[0]:
        if key == "count":
            continue
        values = [float(b[key]) for b in batches]
        if key.endswith("_max"):
            seen = [v for v, c in zip(values, counts, strict=True) if c > 0]
            out[key] = max(seen) if seen else 0.0
        else:
            out[key] = sum(v * c for v, c in zip(values, counts, strict=True)) / max(total, 1.0)
    return out


def combine_split(task: Any, batches: list[Mapping[str, Any]]) -> dict[str, float]:
    """A split's metrics: `combine`, then the task's ``combine_metrics`` (if it has one)
    turns combined counts into scores that are not means over examples (CLRS's F1)."""
    combined = combine(batches)
    finish = getattr(task, "combine_metrics", None)
    return finish(combined) if finish is not None else combined
