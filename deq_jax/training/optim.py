"""The optax optimiser and learning-rate schedule named by ``config.train``.

Fields read: ``optimizer`` (``"adam"`` | ``"adamw"`` | ``"sgd"``), ``learning_rate``,
``schedule`` (``"cosine"`` | ``"constant"``), ``warmup_steps``, ``end_lr_factor``,
``steps``, ``weight_decay`` (adamw), ``b1``, ``b2`` (adam, adamw), ``momentum``
(sgd) and ``grad_clip_norm`` (0 turns clipping off).

The clipping (`clip_by_global_norm`) and the ``grad_norm`` metric use `global_norm`,
which does not overflow: ``optax.tree.norm`` squares in float32, so gradients with
entries above about 1e19 (an unrolled processor whose states explode at its
initialisation) give an infinite norm although every entry is finite; optax's clipping
then scales every update by ``max_norm / inf = 0`` and the run never moves, silently.

References:
  Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
  Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm Restarts", ICLR 2017.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("cosine", "constant")


def _choice(value: str, valid: tuple[str, ...], field: str) -> str:
    if value not in valid:
        raise ValueError(f"Unknown {field} {value!r}. Valid values: {', '.join(valid)}.")
    return value


def make_schedule(train: Any) -> optax.Schedule:
    """Linear warm-up from 0 to ``learning_rate``, then cosine decay or a constant.

    The cosine decays to ``learning_rate * end_lr_factor`` at ``steps``.
    """
    kind = _choice(train.schedule, SCHEDULES, "train.schedule")
    peak, warmup = float(train.learning_rate), int(train.warmup_steps)
    if warmup < 0 or warmup > train.steps:
        raise ValueError(f"train.warmup_steps={warmup} must lie in [0, train.steps={train.steps}].")
    if kind == "constant":
        after = optax.constant_schedule(peak)
    else:
        after = optax.cosine_decay_schedule(
            peak, decay_steps=max(train.steps - warmup, 1), alpha=float(train.end_lr_factor)
        )
    if warmup == 0:
        return after
    ramp = optax.linear_schedule(0.0, peak, warmup)
    return optax.join_schedules([ramp, after], [warmup])


def global_norm(tree: Any) -> jax.Array:
    """The L2 norm over every entry of ``tree``, as ``optax.tree.norm``, but finite
    whenever every entry is: where the plain sum of squares overflows, the norm is
    computed from the entries divided by the largest magnitude. Where the plain norm is
    finite it is returned unchanged, bit for bit; a NaN or infinite entry still gives a
    non-finite norm."""
    plain = optax.tree.norm(tree)
    leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree_util.tree_leaves(tree)]
    if not leaves:
        return plain

    def rescaled() -> jax.Array:
        largest = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))
        scale = jnp.where(jnp.isfinite(largest) & (largest > 0), largest, 1.0)
        scaled = scale * jnp.sqrt(sum(jnp.sum(jnp.square(x / scale)) for x in leaves))
        return scaled.astype(plain.dtype)

    # The rescaled pass runs only where the plain norm is not finite (a select under vmap).
    return jax.lax.cond(jnp.isfinite(plain), lambda: plain, rescaled)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` with `global_norm`: updates whose norm exceeds
    ``max_norm`` are scaled to it, also when their squared norm overflows float32 (where
    optax's version zeroes them). Its state is optax's (``optax.EmptyState``), so
    checkpoints of either restore into the other."""

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple:
        del params
        norm = global_norm(updates)
        within = norm < max_norm
        clip = lambda t: jax.lax.select(within, t, (t / norm.astype(t.dtype)) * max_norm)
        return jax.tree_util.tree_map(clip, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def make_optimizer(train: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds ``(tx, schedule)``: optional global-norm clipping, then the optimiser.

    Args:
      train: the ``config.train`` section.

    Raises:
      ValueError: for an unknown optimiser or schedule, listing the valid ones.
    """
    kind = _choice(train.optimizer, OPTIMIZERS, "train.optimizer")
    schedule = make_schedule(train)
    if kind == "adam":
        opt = optax.adam(schedule, b1=train.b1, b2=train.b2)
    elif kind == "adamw":
        opt = optax.adamw(schedule, b1=train.b1, b2=train.b2, weight_decay=train.weight_decay)
    else:
        opt = optax.sgd(schedule, momentum=train.momentum or None)
    if train.grad_clip_norm > 0:
        opt = optax.chain(clip_by_global_norm(train.grad_clip_norm), opt)
    return opt, schedule
