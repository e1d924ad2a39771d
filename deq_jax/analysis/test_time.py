"""Test-time scaling: task metrics and convergence as a function of the solver budget.

A path-independent equilibrium model keeps improving on harder inputs as it is given
more iterations at test time; a path-dependent one peaks near its training depth. This
module measures that curve for any model called as ``apply(inputs, max_iter) ->
(outputs, stats)`` (the convention of `deq_jax.models`).

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (Figure 2b).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from deq_jax.solvers.base import SolverStats

Batch = Mapping[str, Any]


def _weighted_mean(rows: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
    total = float(sum(weights))
    return {
        key: float(sum(w * r[key] for r, w in zip(rows, weights, strict=True)) / max(total, 1.0))
        for key in rows[0]
    }


def test_time_scaling(
    apply: Callable[[Any, int], tuple[Any, SolverStats]],
    batches: Mapping[str, Callable[[], Iterable[Batch]]],
    budgets: Sequence[int],
    metric_fn: Callable[[Any, Any, Any], Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Evaluates every split at every iteration budget.

    Args:
      apply: ``apply(inputs, max_iter) -> (outputs, stats)``, e.g. a jitted
        ``lambda x, n: model.apply(variables, x, train=False, max_iter=n)`` (``n`` must
        be static under `jax.jit`).
      batches: ``{split: make_batches}``, each call of ``make_batches()`` giving one
        pass of ``{"inputs", "targets", "mask"}`` batches (``mask`` marks real rows).
      budgets: the ``max_iter`` values to try.
      metric_fn: ``metric_fn(outputs, targets, mask) -> {name: value}`` for one batch
        (a task's ``metrics``); a ``"count"`` entry, if present, weights the batches.

    Returns:
      One row per (split, budget): the metrics averaged over the split (weighted by
      ``count``, or by real rows), plus ``nstep_mean``, ``rel_residual_mean`` and
      ``converged`` (fraction), all over real rows.
    """
    rows = []
    for split, make_batches in batches.items():
        for budget in budgets:
            parts, weights = [], []
            for batch in make_batches():
                outputs, stats = apply(batch["inputs"], int(budget))
                mask = np.asarray(batch["mask"], bool)
                metrics = {
                    k: float(v)
                    for k, v in metric_fn(outputs, batch["targets"], batch["mask"]).items()
                    if k != "count"
                }
                real = max(int(mask.sum()), 1)
                metrics["nstep_mean"] = float(np.asarray(stats.nstep)[mask].sum()) / real
                metrics["rel_residual_mean"] = (
                    float(np.asarray(stats.rel_residual)[mask].sum()) / real
                )
                metrics["converged"] = float(np.asarray(stats.converged)[mask].sum()) / real
                parts.append(metrics)
                weights.append(float(mask.sum()))
            rows.append({"split": split, "max_iter": int(budget), **_weighted_mean(parts, weights)})
    return rows


test_time_scaling.__test__ = False  # a library function, not a pytest test


def accuracy_from_logits(logits: Any, targets: Any, mask: Any) -> dict[str, Any]:
    """Classification accuracy over the real rows; a default ``metric_fn``."""
    correct = jnp.argmax(logits, axis=-1) == targets
    correct = correct.reshape(correct.shape[0], -1).mean(axis=1)  # [B]
    weight = jnp.asarray(mask, correct.dtype)
    return {"accuracy": jnp.sum(correct * weight) / jnp.maximum(jnp.sum(weight), 1.0)}
