"""The jitted train and eval steps of a language model with segment memory.

A language model here is `deq_jax.models.language.DEQTransformerLM` (or any linen module
with its call): ``model.apply(variables, tokens [B, L], mems=..., targets=...,
train=..., max_iter=...) -> LMOutput`` with the per-token ``nll [B, L]``, the
next segment's memory ``mems`` and the DEQ's per-row `deq_jax.SolverStats`. The steps
carry the memory from one segment to the next (Transformer-XL): each takes the memory of
the previous segment and returns the new one, sharded along the batch axis like the
tokens.

The train step minimises the mean ``nll`` over the real tokens (where the model returns
a fixed-point correction loss, ``mode="unrolled"``, the deq-lm recipe of TorchDEQ, that
loss instead: the nll at several states of the unrolled trajectory, weighted by the
model and ending with the last state's), plus the penalty terms of the Jacobian
regulariser (`JacobianRegularizer`), which the DEQ evaluates at ``z*`` and sows per row.
The weight-tied warm-up (locuslab's ``pretrain_steps``) is the same step built on
``model.clone(mode="weight_tied")``.

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019 (the segment memory).
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the
  fixed-point correction loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from deq_jax.backward.probe import stats_probe
from deq_jax.nn.deq import with_terms
from deq_jax.training.families.metrics import masked_mean, solver_metrics, term_values
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.steps import (
    INTERMEDIATES,
    JACOBIAN_STREAM,
    RNG_STREAMS,
    net_terms,
    step_key,
)
from deq_jax.training.families.update import apply_update, drawn_gradients
from deq_jax.training.run import sharding
from deq_jax.training.run.nonfinite import finite_memory
from deq_jax.training.run.state import TrainState

# What the device arrays of an LM batch are (the task's ``reset`` flag stays on the host).
LM_KEYS = ("inputs", "targets", "mask")
LN2 = math.log(2.0)


def memory_shardings(mems: Any, mesh: Mesh, batch_size: int) -> Any:
    """Shardings of a memory pytree: leaves with the batch axis first are split over
    data x fsdp like the tokens, the rest (e.g. the count of filled slots) replicated."""
    data, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    return jax.tree_util.tree_map(
        lambda x: data if np.ndim(x) and np.shape(x)[0] == batch_size else repl, mems
    )


def place_memory(mems: Any, mesh: Mesh, batch_size: int) -> Any:
    """``mems`` on the mesh with `memory_shardings` (a fresh memory, or one restored)."""
    return jax.device_put(mems, memory_shardings(mems, mesh, batch_size))


def _row_mask(mask: jax.Array) -> jax.Array:
    """``[B]``: rows with at least one real token (the solver statistics' mask)."""
    return jnp.any(mask, axis=-1)


def _token_metrics(nll: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    mean = masked_mean(nll, mask)
    return {"nll": mean, "bpt": mean / LN2}


def correction_loss(correction_nll: jax.Array, mask: jax.Array) -> jax.Array:
    """The sum over the trajectory's states of the mean nll of the real tokens.

    Args:
      correction_nll: ``[S, B, L]`` the nll at ``S`` states of the trajectory, the last
        one the final state's, already weighted by the model (``correction_gamma`` to
        the distance from the end).
      mask: ``[B, L]`` real tokens.
    """
    return jnp.sum(jax.vmap(lambda nll: masked_mean(nll, mask))(correction_nll))


def _objective(state: TrainState, mems: Any, batch, rngs, terms, solves: bool):
    """``objective(params, probe, net) -> (loss, aux)`` on a batch of segments: the mean
    nll of the real tokens (or the correction loss, which ends with it) plus the
    penalty terms of a solving model."""
    tokens, targets, mask = batch["inputs"], batch["targets"], batch["mask"]
    rows = _row_mask(mask)

    def objective(params, probe, net):
        out, new_model_state = net.apply(
            state.variables(params),
            tokens,
            mems=mems,
            targets=targets,
            train=True,
            rngs=rngs,
            mutable=[*state.model_state, INTERMEDIATES],
            stats_probe=probe,
        )
        new_model_state = dict(new_model_state)
        intermediates = new_model_state.pop(INTERMEDIATES, {})
        nll = masked_mean(out.nll, mask)
        loss, extra = nll, {}
        if out.correction_nll is not None:  # replaces the nll: its last state is it
            loss = extra["correction_loss"] = correction_loss(out.correction_nll, mask)
        values = term_values(intermediates, terms, rows, nll.dtype)
        for term in net_terms(net) if solves else ():
            if term.penalises:
                loss = loss + term.weight_at(state.step) * values[term.name]
        extra.update(values)
        stats = out.stats._replace(trace=jnp.zeros((), nll.dtype))
        aux = dict(nll=out.nll, mems=out.mems, stats=stats, extra=extra)
        return loss, dict(aux, model_state=new_model_state)

    return objective


def make_lm_train_step(
    model: Any,
    schedule: optax.Schedule,
    mesh: Mesh,
    mem_template: Any,
    *,
    regularizer: JacobianRegularizer | None = None,
    state_sharding: Any = None,
) -> Callable[..., tuple[TrainState, Any, dict[str, jax.Array]]]:
    """Builds ``train_step(state, mems, batch) -> (state, mems, metrics)``, jitted.

    Args:
      model: the language model (see the module docstring).
      schedule: the learning-rate schedule, reported as ``learning_rate``.
      mesh: the run's mesh; tokens and memory are split over data x fsdp.
      mem_template: a memory of the global batch (fixes the memory's shardings).
      state_sharding: the shardings of the state (`sharding.shardings_of` a placed
        state); ``None``: replicated.
      regularizer: the Jacobian regulariser; ``None`` or a disabled one adds nothing.
        With ``jacobian_freq < 1`` or a ``jacobian_stop_step`` a `jax.lax.cond` on the
        step's draw (`JacobianRegularizer.draw`) runs the regularised or the plain
        gradient (locuslab's ``jac_loss_freq``). Not applied in the stacked modes (no
        fixed point); refused with ``"unrolled"``.

    Raises:
      ValueError: for the Jacobian term on a ``mode="unrolled"`` model.

    Returns:
      The jitted step (the state is donated). ``metrics`` holds ``loss``, ``nll`` (mean
      nll per real token, nats), ``bpt`` (bits per token: bits per character on a
      character-level task), the forward solver's ``nstep_mean`` / ``nstep_max`` /
      residuals / convergence rate over the rows, the backward solve's ``bwd_*``,
      ``grad_norm``, ``param_norm``, ``learning_rate``, ``tokens`` and, where they
      apply, ``correction_loss``, ``jacobian_term`` (NaN on a step that skips it),
      ``jacobian_weight`` and ``jacobian_applied``.
    """
    model = sharding.place_solve(model, mesh)  # the solve's state over data x fsdp
    reg = regularizer or JacobianRegularizer()
    jacobian = reg.jacobian_term()
    mode = getattr(model, "mode", "deq")
    solves = mode == "deq"  # a DEQ solve in training
    if jacobian is not None and mode == "unrolled":
        raise ValueError(
            "The Jacobian term is evaluated at the fixed point a training solve finds; "
            "mode='unrolled' trains without a solve (its correction loss plays that part). "
            "Set regularizer.jacobian_weight=0 or model.mode='deq'."
        )
    if not solves:
        reg, jacobian = JacobianRegularizer(), None  # a stacked warm-up: no fixed point
    regularised = with_terms(model, (jacobian,)) if jacobian is not None else model
    terms = net_terms(regularised) if solves else ()

    def train_step(state: TrainState, mems: Any, batch: dict[str, jax.Array]):
        mask = batch["mask"]
        rows = _row_mask(mask)
        k_jacobian, k_draw = jax.random.split(step_key(state))
        rngs = {**state.step_rngs(*RNG_STREAMS), JACOBIAN_STREAM: k_jacobian}
        objective = _objective(state, mems, batch, rngs, terms, solves)

        def gradients(net):
            grad_fn = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
            return grad_fn(state.params, stats_probe(), net)

        # locuslab's jac_loss_freq and JAC_STOP_EPOCH: the term on the drawn steps
        result, applied = drawn_gradients(
            reg, k_draw, state.step, gradients, regularised, model, gate=False
        )
        (loss, aux), _ = result
        metrics = {"loss": loss, **_token_metrics(aux["nll"], mask), **aux["extra"]}
        metrics.update(solver_metrics(aux["stats"], rows))
        metrics["tokens"] = jnp.sum(mask.astype(jnp.float32))
        state, metrics = apply_update(
            state, result, metrics, schedule, reg, applied, aux["model_state"]
        )
        return state, finite_memory(aux["mems"], mems), metrics

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    placed = repl if state_sharding is None else state_sharding
    mem = memory_shardings(mem_template, mesh, _batch_of(mem_template))
    return jax.jit(
        train_step,
        in_shardings=(placed, mem, data),
        out_shardings=(placed, mem, repl),
        donate_argnums=(0, 1),
    )


def make_lm_eval_step(
    model: Any,
    mesh: Mesh,
    mem_template: Any,
    *,
    max_iter: int | None = None,
    donate: bool = True,
) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
    """Builds ``eval_step(state, mems, batch) -> (mems, sums)`` at the budget ``max_iter``
    (``None``: the model's eval budget).

    ``sums`` holds sums over the batch, for streaming a whole split: ``nll_sum`` and
    ``count`` over the real tokens, ``nstep_sum``, ``nstep_max``, ``converged_sum``,
    ``rel_residual_sum`` and ``rows`` over the rows with a real token. A batch with a
    ``"keep"`` key (``bool``, the shape of ``mask``) also gets ``kept_nll_sum`` and
    ``kept_count`` over the real tokens it keeps, in the same pass. The memory
    argument is donated unless ``donate=False`` (to call the step again on it, as a
    benchmark does).
    """
    model = sharding.place_solve(model, mesh)

    def eval_step(state: TrainState, mems: Any, batch: dict[str, jax.Array]):
        mask = batch["mask"]
        out = model.apply(
            state.variables(),
            batch["inputs"],
            mems=mems,
            targets=batch["targets"],
            train=False,
            max_iter=max_iter,
        )
        rows = _row_mask(mask)
        nstep = jnp.asarray(out.stats.nstep, jnp.float32)
        finite = jnp.isfinite(out.stats.rel_residual)
        sums = {
            "nll_sum": jnp.sum(jnp.where(mask, out.nll, 0.0)),
            "count": jnp.sum(mask.astype(jnp.float32)),
            "nstep_sum": jnp.sum(jnp.where(rows, nstep, 0.0)),
            "nstep_max": jnp.max(jnp.where(rows, nstep, 0.0)),
            "converged_sum": jnp.sum(jnp.where(rows, out.stats.converged, False)),
            "rel_residual_sum": jnp.sum(jnp.where(rows & finite, out.stats.rel_residual, 0.0)),
            "rows": jnp.sum(rows.astype(jnp.float32)),
        }
        if "keep" in batch:
            kept = mask & batch["keep"]
            sums["kept_nll_sum"] = jnp.sum(jnp.where(kept, out.nll, 0.0))
            sums["kept_count"] = jnp.sum(kept.astype(jnp.float32))
        return out.mems, sums

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    mem = memory_shardings(mem_template, mesh, _batch_of(mem_template))
    return jax.jit(
        eval_step,
        in_shardings=(None, mem, data),  # the state where it lies
        out_shardings=(mem, repl),
        donate_argnums=1 if donate else (),
    )


def _batch_of(mems: Any) -> int:
    """The batch size of a memory: the leading size of its largest-rank leaf."""
    leaves = [x for x in jax.tree_util.tree_leaves(mems) if np.ndim(x)]
    if not leaves:
        raise ValueError("A memory needs at least one leaf with a batch axis.")
    return int(np.shape(max(leaves, key=np.ndim))[0])
