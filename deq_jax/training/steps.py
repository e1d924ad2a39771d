"""The jitted train and eval steps of a classification model built around a DEQ.

A model here is a linen module called as ``model.apply(variables, inputs, train=...,
max_iter=...) -> (logits [B, ..., C], stats)`` with ``stats`` the DEQ's per-sample
`deq_jax.SolverStats` (see `deq_jax.nn.models`). Targets are integer labels ``[B, ...]``
and ``mask [B]`` marks real (not padding) examples.

Both steps are `jax.jit` functions whose inputs carry `NamedSharding`s (state
replicated, batch split along the data axis; `deq_jax.training.sharding`), so XLA
splits the work over devices and averages the gradients itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from deq_jax.solvers.base import SolverStats
from deq_jax.training import sharding
from deq_jax.training.state import TrainState

# Metrics a task computes from (logits, targets, mask); e.g. `PrefixSumTask.metrics`.
TaskMetrics = Callable[[jax.Array, jax.Array, jax.Array], Mapping[str, jax.Array]]

# Rng streams a step hands to the model: dropout masks and random initial states.
RNG_STREAMS = ("dropout", "z0")


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
    ce = ce.reshape(ce.shape[0], -1).mean(axis=1)  # [B]
    w = mask.astype(ce.dtype)
    return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)


def solver_metrics(stats: SolverStats, mask: jax.Array) -> dict[str, jax.Array]:
    """Means (and the max of ``nstep``) of the solver statistics over real examples."""
    w = mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(w), 1.0)
    mean = lambda x: jnp.sum(jnp.asarray(x, jnp.float32) * w) / n
    finite = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
    return {
        "nstep_mean": mean(stats.nstep),
        "nstep_max": jnp.max(jnp.where(mask, stats.nstep, 0)),
        "abs_residual": mean(finite(stats.abs_residual)),
        "rel_residual": mean(finite(stats.rel_residual)),
        "converged": mean(stats.converged),
        "diverged": mean(stats.diverged),
    }


def _task_metrics(metrics_fn: TaskMetrics, logits, targets, mask) -> dict[str, jax.Array]:
    out = dict(metrics_fn(logits, targets, mask))
    out.pop("count", None)
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def make_train_step(
    model: Any, metrics_fn: TaskMetrics, schedule: optax.Schedule, mesh: Mesh
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds ``train_step(state, batch) -> (state, metrics)``, jitted over ``mesh``.

    Args:
      model: the linen model (see the module docstring).
      metrics_fn: the task's metrics, ``(logits, targets, mask) -> dict``.
      schedule: the learning-rate schedule, reported as ``learning_rate``.
      mesh: the data-parallel mesh.

    Returns:
      The jitted step. ``metrics`` holds ``loss``, the task's metrics (e.g.
      ``bit_accuracy``), ``accuracy`` (the first of those), the solver's ``nstep_mean``,
      ``nstep_max``, residuals and convergence rate, ``grad_norm``, ``param_norm`` and
      ``learning_rate``, all scalars. The state is donated.
    """

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        inputs, targets, mask = batch["inputs"], batch["targets"], batch["mask"]
        mutable = list(state.model_state)

        def loss_fn(params):
            out = model.apply(
                state.variables(params),
                inputs,
                train=True,
                rngs=state.step_rngs(*RNG_STREAMS),
                mutable=mutable or False,
            )
            (logits, stats), new_model_state = out if mutable else (out, {})
            return classification_loss(logits, targets, mask), (logits, stats, new_model_state)

        (loss, (logits, stats, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params
        )
        metrics = {"loss": loss}
        task_metrics = _task_metrics(metrics_fn, logits, targets, mask)
        metrics["accuracy"] = next(iter(task_metrics.values()))
        metrics.update(task_metrics)
        metrics.update(solver_metrics(stats, mask))
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["param_norm"] = optax.tree.norm(state.params)
        metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
        state = state.apply_gradients(grads=grads, model_state=dict(new_model_state))
        return state, metrics

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    return jax.jit(
        train_step, in_shardings=(repl, data), out_shardings=(repl, repl), donate_argnums=0
    )


def make_eval_step(
    model: Any, metrics_fn: TaskMetrics, mesh: Mesh, max_iter: int | None = None
) -> Callable[[TrainState, dict[str, jax.Array]], dict[str, jax.Array]]:
    """Builds ``eval_step(state, batch) -> metrics`` at the solver budget ``max_iter``.

    Args:
      model: the linen model.
      metrics_fn: the task's metrics.
      mesh: the data-parallel mesh.
      max_iter: the solver budget; ``None`` keeps the model's eval budget.

    Returns:
      The jitted step. ``metrics`` holds ``loss``, the task's metrics, the solver
      metrics and ``count`` (real examples in the batch), for `combine`.
    """

    def eval_step(state: TrainState, batch: dict[str, jax.Array]):
        inputs, targets, mask = batch["inputs"], batch["targets"], batch["mask"]
        logits, stats = model.apply(
            state.variables(),
            inputs,
            train=False,
            max_iter=max_iter,
            rngs=state.step_rngs(*RNG_STREAMS),
        )
        metrics = {"loss": classification_loss(logits, targets, mask)}
        metrics.update(_task_metrics(metrics_fn, logits, targets, mask))
        metrics.update(solver_metrics(stats, mask))
        metrics["count"] = jnp.sum(mask.astype(jnp.int32))
        return metrics

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    return jax.jit(eval_step, in_shardings=(repl, data), out_shardings=repl)


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
