"""The optax optimiser and learning-rate schedule named by ``config.train``.

Fields read: ``optimizer`` (``"adam"`` | ``"adamw"`` | ``"sgd"``), ``learning_rate``,
``schedule`` (``"cosine"`` | ``"constant"``), ``warmup_steps``, ``end_lr_factor``,
``steps``, ``weight_decay`` (adamw), ``b1``, ``b2`` (adam, adamw), ``momentum``
(sgd) and ``grad_clip_norm`` (0 turns clipping off).

References:
  Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
  Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm Restarts", ICLR 2017.
"""

from __future__ import annotations

from typing import Any

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
        opt = optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), opt)
    return opt, schedule
