"""Path-independence analysis of whole task models, not just of a bare `DEQ`.

`deq_jax.nn.deq_call` intercepts a task model's (`deq_jax.models`) first DEQ call and hands back its
problem as pure pieces, the inputs of the cell-level tools `aa_score` and
`adversarial_aa`. On top of it:

* `model_aa_score`: Algorithm 1 of Anil et al. on a whole model;
* `model_adversarial_aa`: the attacked AA score and the model's outputs at the attacked
  fixed points (for attacked accuracy, read out by `deq_jax.nn.outputs_at`).

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022
  (Algorithm 1 and Section 4.2).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa
from deq_jax.analysis.path_independence import derangement, per_sample_cosine
from deq_jax.nn.intercept import DEQCall, deq_call, outputs_at


def model_aa_score(
    model: nn.Module,
    variables: Any,
    inputs: Any,
    *,
    key: jax.Array,
    max_iter: int | None = None,
    rngs: dict[str, jax.Array] | None = None,
    first: DEQCall | None = None,
    **model_kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """The AA score (Algorithm 1 of Anil et al.) of a whole task model.

    Solves every input from the model's training-time initialisation, then again from
    the fixed point of another input of the batch (a random derangement), and returns
    the cosine similarity of the two fixed points.

    Args:
      model: a linen model holding a `deq_jax.nn.DEQ`.
      variables: its variables.
      inputs: a batch of at least 2 inputs.
      key: draws the pairing.
      max_iter: the solver budget (``None``: the model's eval budget).
      rngs: rngs of the first solve (``{"z0": key}`` for a random ``z_init``).
      first: the `deq_call` of these arguments if the caller already made it (its
        outputs are wanted too); it is reused instead of solving again.
      **model_kwargs: more keywords of the model call.

    Returns:
      ``(mean, per_instance [B])``.
    """
    if first is None:
        first = deq_call(model, variables, inputs, max_iter=max_iter, rngs=rngs, **model_kwargs)
    batch = jax.tree_util.tree_leaves(first.z_star)[0].shape[0]
    perm = derangement(key, batch)
    start = jax.tree_util.tree_map(lambda z: z[perm], first.z_star)
    again = deq_call(model, variables, inputs, z0=start, max_iter=max_iter, **model_kwargs)
    per_instance = per_sample_cosine(first.z_star, again.z_star)
    return jnp.mean(per_instance), per_instance


def model_adversarial_aa(
    model: nn.Module,
    variables: Any,
    inputs: Any,
    *,
    key: jax.Array,
    max_iter: int | None = None,
    rngs: dict[str, jax.Array] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    **attack_options: Any,
) -> tuple[AttackResult, Any]:
    """`adversarial_aa` on a whole model, plus its outputs at the attacked fixed points.

    Args:
      model: a linen model holding a `deq_jax.nn.DEQ`.
      variables: its variables.
      inputs: a batch of inputs.
      key: draws the attack's random restarts.
      max_iter: the solver budget of the reference and attacked solves.
      rngs: rngs of the reference solve.
      model_kwargs: more keywords of the model call (e.g. ``{"adjacency": a}``).
      **attack_options: ``steps``, ``restarts``, ``lbfgs_iters``, ``init_scale`` of
        `adversarial_aa`.

    Returns:
      ``(attack, attacked_outputs)``: the `AttackResult` and the model's outputs read
      out at ``attack.fixed_points`` (score them with the task's metrics for the
      attacked accuracy).
    """
    model_kwargs = model_kwargs or {}
    call = deq_call(model, variables, inputs, max_iter=max_iter, rngs=rngs, **model_kwargs)
    p = call.problem
    attack = adversarial_aa(p.f, p.z0, p.args, solver=p.solver, key=key, **attack_options)
    outputs = outputs_at(model, variables, inputs, attack.fixed_points, **model_kwargs)
    return attack, outputs
