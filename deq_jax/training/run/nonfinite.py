"""Non-finite training steps: skipped on the device, counted and, too many in a row,
the end of the run.

A DEQ step can meet a NaN or an infinity (a bad input, a diverging solve, an overflow
in the backward pass). The jitted train steps (`deq_jax.training.families.steps`,
`deq_jax.training.families.lm_steps`) apply an update through `apply_if_finite`: when the loss or
any gradient is not finite, the parameters, optimiser state and model state stay
bit-for-bit what they were (only ``step`` advances, so the next step draws fresh keys
and its own batch), and the step's ``skipped_steps`` metric is 1. The loss and the
gradients are global arrays under the data-parallel mesh, so every device takes the same
decision. On the host, `NonFiniteSteps` logs each skipped step and raises
`NonFiniteLossError` after ``train.max_nonfinite_steps`` of them in a row; the loops save
no checkpoint on a skipped step, so the latest checkpoint is the last good one.

Unlike ``optax.apply_if_finite`` this leaves the optimiser state's structure alone, so
checkpoints written before it still restore, and it guards the model state too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax.backward.nonfinite import all_finite
from deq_jax.training.run.checkpoint import Checkpointer
from deq_jax.training.run.state import TrainState

# The train metric that is 1 on a skipped step (summed over a logging interval).
SKIPPED = "skipped_steps"


class NonFiniteLossError(FloatingPointError):
    """Too many training steps in a row had a NaN or infinite loss or gradient."""


def apply_if_finite(
    state: TrainState, loss: jax.Array, grads: Any, model_state: Any
) -> tuple[TrainState, jax.Array]:
    """``state.apply_gradients(grads)`` if ``loss`` and every gradient are finite.

    Args:
      state: the train state before the step.
      loss: the step's scalar loss.
      grads: the gradients w.r.t. ``state.params``.
      model_state: the model's updated other collections (e.g. ``"batch_stats"``).

    Returns:
      ``(state, skipped)``: on a non-finite step ``params``, ``opt_state`` and
      ``model_state`` are the old ones, bit for bit, and only ``step`` advances;
      ``skipped`` is a float32 scalar, 1 on such a step and 0 otherwise.
    """
    finite = jnp.isfinite(loss) & all_finite(grads)
    new = state.apply_gradients(grads=grads, model_state=model_state)
    keep = lambda fresh, old: jax.tree_util.tree_map(
        lambda a, b: jnp.where(finite, a, b), fresh, old
    )
    state = new.replace(
        params=keep(new.params, state.params),
        opt_state=keep(new.opt_state, state.opt_state),
        model_state=keep(new.model_state, state.model_state),
    )
    return state, (~finite).astype(jnp.float32)


def finite_memory(new: Any, old: Any) -> Any:
    """A language model's next segment memory: ``new`` unless one of its entries is
    non-finite, then ``old`` (a NaN memory would spoil every following segment)."""
    ok = all_finite(new)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)


class NonFiniteSteps:
    """The host's side: logs each skipped step and stops after too many in a row.

    Args:
      limit: ``train.max_nonfinite_steps``, the skipped steps in a row that stop the run.
      ckpt: the run's checkpointer (its latest step is named in the error).
      emit: receives the line logged for each skipped step.
      advice: what to try, appended to the error.

    Raises:
      ValueError: for a ``limit`` below 1.
    """

    def __init__(self, limit: int, ckpt: Checkpointer, emit: Callable[[str], None], advice: str):
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(
                f"train.max_nonfinite_steps must be an integer >= 1, got {limit!r} "
                "(1 stops the run at the first non-finite step)."
            )
        self.limit, self._ckpt, self._emit, self._advice = limit, ckpt, emit, advice
        self.in_a_row = 0
        self.total = 0

    def skipped(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Whether ``step`` was skipped (its ``skipped_steps`` metric); logs it.

        Raises:
          NonFiniteLossError: on the ``limit``-th skipped step in a row, naming the
            steps, the last good checkpoint and the advice.
        """
        if not float(metrics[SKIPPED]):
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        self.total += 1
        loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
        what = f"Non-finite training loss ({loss}) or gradient norm ({grad_norm}) at step {step}"
        if self.in_a_row >= self.limit:
            first = step - self.in_a_row + 1
            raise NonFiniteLossError(
                f"{what}, {self.in_a_row} step(s) in a row (steps {first} to {step}; "
                f"train.max_nonfinite_steps={self.limit}); stopping. The last good checkpoint "
                f"is step {self._ckpt.latest_step()} in {self._ckpt.directory}. {self._advice}"
            )
        self._emit(
            f"{what}: update skipped (parameters and optimiser state unchanged), "
            f"{self.in_a_row} in a row of at most {self.limit} (train.max_nonfinite_steps)."
        )
        return True


def logged(metrics: Mapping[str, Any], skipped: bool) -> dict[str, Any]:
    """What a step adds to the logging interval: a skipped step only its count, so the
    interval's means stay those of the applied steps."""
    return {SKIPPED: 1.0} if skipped else dict(metrics)
