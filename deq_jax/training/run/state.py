"""`TrainState`: parameters, optimiser state, step, model state and the run's rng key.

With weight averaging (``train.ema_decay > 0``, `deq_jax.training.run.optim.weight_average`)
the optimiser state also holds a moving average of the parameters; `TrainState.variables`
then hands out the average, so every evaluation, report and analysis scores it, while
the train steps differentiate ``state.params``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from deq_jax.training.run.optim import averaged_params


class TrainState(train_state.TrainState):
    """Flax's `TrainState` plus what a DEQ model needs besides its parameters.

    Attributes:
      model_state: the model's other variable collections (e.g. ``"batch_stats"`` of
        spectral norm), ``{}`` for most models; updated by the train step.
      rng: the run's base key (raw ``uint32[2]``). Step ``s`` draws its keys from
        ``fold_in(rng, s)``, so a resumed run sees the same randomness as an
        uninterrupted one.
      use_average: whether `variables` hands out the optimiser state's moving average
        of the parameters, where it keeps one (a static field; `without_average`).
    """

    model_state: Any = None
    rng: jax.Array | None = None
    use_average: bool = struct.field(pytree_node=False, default=True)

    def step_rngs(self, *names: str) -> dict[str, jax.Array]:
        """One key per rng stream name for the current step, e.g. ``"dropout"``, ``"z0"``."""
        keys = jax.random.split(jax.random.fold_in(self.rng, self.step), len(names))
        return dict(zip(names, keys, strict=True))

    @property
    def has_average(self) -> bool:
        """Whether the optimiser state keeps a moving average of the parameters."""
        return averaged_params(self.opt_state) is not None

    @property
    def eval_params(self) -> Any:
        """The weights to evaluate: the moving average where the optimiser state keeps
        one (and ``use_average``), else ``params``."""
        average = averaged_params(self.opt_state) if self.use_average else None
        return self.params if average is None else average

    def variables(self, params: Any = None) -> dict[str, Any]:
        """``{"params": params, **model_state}`` for ``model.apply``; without ``params``,
        the weights to evaluate (`eval_params`). The train steps pass ``state.params``."""
        params = self.eval_params if params is None else params
        return {"params": params, **self.model_state}

    def without_average(self) -> TrainState:
        """This state with its raw weights as the ones to evaluate."""
        return self.replace(use_average=False)


def create_train_state(
    model: nn.Module,
    tx: optax.GradientTransformation,
    sample_inputs: Any,
    rng: jax.Array,
) -> TrainState:
    """Initialises ``model`` on ``sample_inputs`` and wraps it with ``tx`` in a state.

    Args:
      model: a linen module called as ``model(inputs, train=...)``.
      tx: the optax optimiser.
      sample_inputs: a batch of inputs fixing the parameter shapes.
      rng: the run's key; split into the init keys and the state's base key.

    Returns:
      A `TrainState` at step 0.
    """
    k_params, k_z0, k_dropout, k_run = jax.random.split(rng, 4)
    init = jax.jit(lambda rngs, x: model.init(rngs, x, train=False))  # one compile, not eager
    variables = init({"params": k_params, "z0": k_z0, "dropout": k_dropout}, sample_inputs)
    variables = dict(variables)
    params = variables.pop("params")
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=tx, model_state=variables, rng=k_run
    )
    return state.replace(step=jnp.zeros((), jnp.int32))
