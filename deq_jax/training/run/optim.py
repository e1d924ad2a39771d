"""The optax optimiser and learning-rate schedule named by ``config.train``.

Fields read: ``optimizer`` (``"adam"`` | ``"adamw"`` | ``"sgd"``), ``learning_rate``,
``schedule`` (``"cosine"`` | ``"constant"``), ``warmup_steps``, ``end_lr_factor``,
``steps``, ``weight_decay`` (adamw), ``b1``, ``b2`` (adam, adamw), ``momentum``
(sgd), ``grad_clip_norm`` (0 turns clipping off) and ``ema_decay`` (0 turns weight
averaging off).

Weight averaging (`weight_average`) is the last link of the optimiser's chain: it leaves
the updates alone and keeps, in its state, an exponential moving average of the
parameters they produce, ``avg <- d * avg + (1 - d) * params`` with
``d = min(ema_decay, (1 + n) / (10 + n))`` after ``n`` earlier updates (the warm-up of
TensorFlow's ``ExponentialMovingAverage(num_updates=n)``, so the first averages follow
the fast early training rather than the initialisation). Living in the optimiser state,
it is checkpointed with it, a skipped non-finite step leaves it unchanged
(`deq_jax.training.run.nonfinite`), and a run without it has the optimiser state, and the
checkpoints, it always had.

The clipping (`clip_by_global_norm`) and the ``grad_norm`` metric use `global_norm`,
which does not overflow: ``optax.tree.norm`` squares in float32, so gradients with
entries above about 1e19 (an unrolled processor whose states explode at its
initialisation) give an infinite norm although every entry is finite; optax's clipping
then scales every update by ``max_norm / inf = 0`` and the run never moves, silently.

References:
  Polyak & Juditsky, "Acceleration of Stochastic Approximation by Averaging", SIAM J.
  Control Optim. 1992.
  Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
  Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm Restarts", ICLR 2017.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class WeightAverageState(NamedTuple):
    """`weight_average`'s state: the updates applied so far and the average."""

    count: jax.Array
    average: Any


def check_ema_decay(decay: float) -> float:
    """``train.ema_decay`` as a float in ``[0, 1)``.

    Raises:
      ValueError: outside that range, naming the key.
    """
    decay = float(decay)
    if not 0.0 <= decay < 1.0:
        raise ValueError(
            f"config.train.ema_decay={decay} must lie in [0, 1): 0 turns weight averaging "
            "off; a value such as 0.999 averages over about 1 / (1 - decay) steps."
        )
    return decay


def weight_average(decay: float) -> optax.GradientTransformation:
    """An exponential moving average of the parameters, kept in the optimiser state.

    Chain it last: its ``update`` returns the updates unchanged and averages
    ``params + updates``, the parameters the step produces.

    Raises:
      ValueError: for a decay outside ``[0, 1)``, or an ``update`` without ``params``.
    """
    decay = check_ema_decay(decay)

    def init(params: Any) -> WeightAverageState:
        # A copy: the train step donates its state, and two leaves must not share a buffer.
        average = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), params)
        return WeightAverageState(count=jnp.zeros((), jnp.int32), average=average)

    def update(updates: Any, state: WeightAverageState, params: Any = None) -> tuple:
        if params is None:
            raise ValueError("weight_average needs the parameters: tx.update(g, s, params).")
        n = state.count.astype(jnp.float32)
        d = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
        new = optax.apply_updates(params, updates)

        def mix(average: jax.Array, param: jax.Array) -> jax.Array:
            mixed = d * average.astype(jnp.float32) + (1.0 - d) * param.astype(jnp.float32)
            return mixed.astype(average.dtype)

        average = jax.tree_util.tree_map(mix, state.average, new)
        return updates, WeightAverageState(optax.safe_int32_increment(state.count), average)

    return optax.GradientTransformation(init, update)


def averaged_params(opt_state: Any) -> Any | None:
    """The moving average of the parameters that ``opt_state`` keeps (`weight_average`),
    or ``None`` where it keeps none."""
    is_average = lambda x: isinstance(x, WeightAverageState)
    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_average):
        if is_average(node):
            return node.average
    return None


def make_optimizer(train: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds ``(tx, schedule)``: optional global-norm clipping, the optimiser, then
    optional weight averaging (``train.ema_decay > 0``).

    Args:
      train: the ``config.train`` section.

    Raises:
      ValueError: for an unknown optimiser or schedule, listing the valid ones, or an
        ``ema_decay`` outside ``[0, 1)``.
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
    if check_ema_decay(train.get("ema_decay", 0.0)):
        opt = optax.chain(opt, weight_average(train.ema_decay))
    return opt, schedule
