"""The end every train step shares, whatever the family: the Jacobian term drawn per
step (`drawn_gradients`) and the update applied where it is finite, with the metrics
every step reports (`apply_update`).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the term on a random share of the steps, locuslab's ``jac_loss_freq``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from deq_jax.backward.probe import read_stats_probe
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.run.nonfinite import SKIPPED, apply_if_finite
from deq_jax.training.run.optim import global_norm
from deq_jax.training.run.state import TrainState


def drawn_gradients(
    reg: JacobianRegularizer,
    key: jax.Array,
    step: jax.Array,
    gradients: Callable[..., Any],
    regularised: Any,
    plain: Any,
    *,
    gate: bool,
) -> tuple[Any, jax.Array]:
    """``(gradients(net), applied)``, with the Jacobian term on the steps its draw picks.

    Without a drawn term (``jacobian_freq`` 1 and no stop step) every step runs
    ``gradients(regularised)``. Otherwise the Bernoulli draw of `JacobianRegularizer.draw`
    picks: with ``gate`` every step computes ``gradients(regularised, applied)`` and the
    objective masks the term by ``applied`` (`branches_are_slow`); without, a
    `jax.lax.cond` runs ``gradients(regularised)`` or ``gradients(plain)``, so a skipped
    step costs nothing. ``applied`` is 1.0 where the term counts (0.0 without one).
    """
    if reg.jacobian_term() is None or not reg.drawn:
        return gradients(regularised), jnp.asarray(reg.jacobian_term() is not None, jnp.float32)
    draw = reg.draw(key, step)
    applied = draw.astype(jnp.float32)
    if gate:
        return gradients(regularised, applied), applied
    return jax.lax.cond(draw, lambda: gradients(regularised), lambda: gradients(plain)), applied


def apply_update(
    state: TrainState,
    result: Any,
    metrics: dict[str, jax.Array],
    schedule: optax.Schedule,
    reg: JacobianRegularizer,
    applied: jax.Array,
    model_state: Any,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """The end of every train step: the backward solve's ``bwd_*`` statistics, the
    regulariser's weight and draw, the norms and learning rate join ``metrics``, and the
    update is applied where the loss and gradients are finite (`apply_if_finite`)."""
    (loss, _), (grads, probe_grad) = result
    for name, value in read_stats_probe(probe_grad).items():
        metrics[f"bwd_{name}"] = value
    if reg.jacobian_term() is not None:
        metrics["jacobian_weight"] = reg.weight_at(state.step)
        metrics["jacobian_applied"] = applied
    metrics["grad_norm"] = global_norm(grads)
    metrics["param_norm"] = optax.tree.norm(state.params)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    state, metrics[SKIPPED] = apply_if_finite(state, loss, grads, model_state)
    return state, metrics
