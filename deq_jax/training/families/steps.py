"""The jitted train and eval steps of a model built around a DEQ.

A model here is a linen module with a `deq_jax.nn.DEQSpec` field ``deq`` (or a bare
`deq_jax.nn.DEQ`), called as ``model.apply(variables, inputs, train=..., max_iter=...,
stats_probe=...) -> (outputs, stats)`` with ``stats`` the DEQ's per-sample
`deq_jax.SolverStats` (see `deq_jax.models`). For a classification task
(``task.num_classes`` set) ``outputs`` are logits ``[B, ..., C]`` and targets integer
labels ``[B, ...]``; for a regression task (``num_classes=None``, e.g. ``synthetic_1d``)
outputs and targets are real ``[B, ...]`` and the loss is the mean squared error. ``mask
[B]`` marks real (not padding) examples.

The train step differentiates the loss w.r.t. the parameters and a
`deq_jax.backward.stats_probe`, so the backward solve's statistics are logged next to
the forward ones. Penalties are terms (`deq_jax.regularizers.terms`) handed to the
model's DEQ spec: the Jacobian regulariser's (`JacobianRegularizer`), the spectral hinge
and the alignment penalty (`PathIndependence`); each sows per-sample values and the step
adds ``weight * mean``. All steps are `jax.jit` functions whose inputs carry
`NamedSharding`s (the state replicated or placed by the partition rules, the batch
split over data x fsdp; `deq_jax.training.run.sharding`), so XLA splits the work over
devices, gathers the parameters and reduces the gradients itself.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from deq_jax.backward.probe import stats_probe
from deq_jax.nn.deq import spec_of, with_terms
from deq_jax.regularizers.terms import SpectralRadius, Term
from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.metrics import (
    classification_loss,
    masked_mean,
    regression_loss,
    solver_metrics,
    sown,
    term_values,
)
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.settle import SettleRule
from deq_jax.training.families.update import apply_update, drawn_gradients
from deq_jax.training.run import sharding
from deq_jax.training.run.state import TrainState

# Metrics a task computes from (outputs, targets, mask); e.g. `PrefixSumTask.metrics`.
TaskMetrics = Callable[[jax.Array, jax.Array, jax.Array], Mapping[str, jax.Array]]
# A task's own training loss, ``(outputs, targets, mask, inputs=..., **extras) -> scalar``
# (e.g. `ClrsTask.loss`); tasks without one get `classification_loss` or
# `regression_loss`.
TaskLoss = Callable[..., jax.Array]

# Rng streams a step hands to the model: dropout masks and random initial states.
RNG_STREAMS = ("dropout", "z0")
# The stream of the Jacobian probes, drawn apart so the streams above do not change.
JACOBIAN_STREAM = "jacobian"
INTERMEDIATES = "intermediates"
# Per-example losses ``[B]`` a model sows into "intermediates" under this name (e.g. the
# CLRS model's hint loss and step penalty); the train step adds their masked mean.
AUX_LOSS = "aux_loss"
# Outputs a model sows beside its main ones (e.g. the CLRS model's edge-state logits);
# the train step hands them to the task's loss as ``aux_outputs``.
AUX_OUTPUTS = "aux_outputs"


def net_terms(net: Any) -> tuple[Term, ...]:
    """The penalty terms a model's (or a `DEQ`'s) spec carries; none for a model
    without a `deq_jax.nn.DEQSpec` field ``deq`` (e.g. a wrapper of another model)."""
    spec = spec_of(net)
    return () if spec is None else spec.terms


def _task_metrics(metrics_fn: TaskMetrics, outputs, targets, mask, extra) -> dict[str, jax.Array]:
    out = dict(metrics_fn(outputs, targets, mask, **extra))
    out.pop("count", None)
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def step_key(state: TrainState) -> jax.Array:
    """The step's key for the Jacobian probes and the Bernoulli draw."""
    return jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 0x4A4143)


def branches_are_slow(mesh: Mesh) -> bool:
    """Whether the step should avoid computing gradients inside `jax.lax.cond`: on CPU.

    XLA's CPU backend runs a convolution's weight gradient inside a conditional (or
    loop) body on a generic kernel, 5-15x slower than the same program outside one
    (jax-ml/jax#12868): the width-64 benchmark maze model's train step with the
    Jacobian term drawn on half the steps took 2.1 s under `jax.lax.cond` and 0.60 s
    computing the term every step (BUILD_NOTES "Solvers and gradients",
    `benchmarks.branch_cost`). Accelerators keep the conditional, which skips the term's
    cost.
    """
    return mesh.devices.flat[0].platform == "cpu"


def _objective(state, batch, extras, terms, jacobian, rngs, task_loss_of):
    """``objective(params, probe, net, max_iter, gate) -> (loss, aux)`` on a task's
    batch: the task loss, the sown auxiliary loss and the penalty terms (the Jacobian
    term's masked by ``gate`` where a gate is given)."""
    inputs, targets, mask = batch["inputs"], batch["targets"], batch["mask"]
    extra = {k: batch[k] for k in extras}
    mutable = list(state.model_state)

    def objective(params, probe, net, max_iter: int | None, gate: jax.Array | None):
        (outputs, stats), new_model_state = net.apply(
            state.variables(params),
            inputs,
            train=True,
            max_iter=max_iter,
            rngs=rngs,
            mutable=mutable + [INTERMEDIATES],
            stats_probe=probe,
            **extra,
        )
        new_model_state = dict(new_model_state)
        intermediates = new_model_state.pop(INTERMEDIATES, {})
        aux_outputs = sown(intermediates, AUX_OUTPUTS, required=False)
        more = {} if aux_outputs is None else {"aux_outputs": aux_outputs}
        task_loss = task_loss_of(outputs, targets, mask, inputs=inputs, **extra, **more)
        loss = task_loss
        aux_loss = sown(intermediates, AUX_LOSS, required=False)
        if aux_loss is not None:
            aux_loss = masked_mean(aux_loss, mask)
            loss = loss + aux_loss
        values = term_values(intermediates, terms, mask, task_loss.dtype)
        for term in net_terms(net):
            if term.penalises:
                penalty = term.weight_at(state.step) * values[term.name]
                if gate is not None and term.name == jacobian.name:
                    penalty = jnp.where(gate > 0, penalty, 0.0)  # a skipped step
                loss = loss + penalty
        if gate is not None:  # reported as on a skipped step of `jax.lax.cond`
            for name in jacobian.outputs:
                values[name] = jnp.where(gate > 0, values[name], jnp.nan)
        # The trace's length is the budget: drop it so every budget's branch agrees.
        stats = stats._replace(trace=jnp.zeros((), task_loss.dtype))
        aux = dict(task_loss=task_loss, aux_loss=aux_loss, terms=values, outputs=outputs)
        return loss, dict(aux, stats=stats, model_state=new_model_state)

    return objective


def _loss_of(loss_fn: TaskLoss | None, regression: bool) -> TaskLoss:
    """The task's loss, or the default one (refusing sown ``aux_outputs``)."""
    default_loss = regression_loss if regression else classification_loss

    def task_loss_of(outputs, targets, mask, **batch):
        if loss_fn is not None:
            return loss_fn(outputs, targets, mask, **batch)
        if "aux_outputs" in batch:
            raise ValueError(
                "The model sows aux_outputs, which only a task's own loss can score "
                "(make_train_step(loss_fn=...))."
            )
        return default_loss(outputs, targets, mask)

    return task_loss_of


def _budgeted(objective, state: TrainState, budgets: tuple[int, ...], budget_index):
    """``budgeted(net, gate=None)``: the loss, its aux and the gradients w.r.t. the
    parameters and the stats probe, at the drawn ``budgets[budget_index]`` (no budgets:
    the model's train budget)."""

    def gradients(net, max_iter: int | None = None, gate: jax.Array | None = None):
        grad_fn = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
        return grad_fn(state.params, stats_probe(), net, max_iter, gate)

    def budgeted(net, gate: jax.Array | None = None):
        if not budgets:
            return gradients(net, gate=gate)
        branches = [lambda b=b: gradients(net, b, gate) for b in budgets]
        return jax.lax.switch(budget_index, branches)

    return budgeted


def _step_metrics(loss, aux, metrics_fn, batch, extra, regression: bool) -> dict:
    """A task's train metrics: the losses, penalty terms, task metrics (``accuracy``
    the first, for classification) and the forward solver's statistics."""
    targets, mask = batch["targets"], batch["mask"]
    metrics = {"loss": loss, "task_loss": aux["task_loss"]}
    if aux["aux_loss"] is not None:
        metrics["aux_loss"] = aux["aux_loss"]
    metrics.update(aux["terms"])
    task_metrics = _task_metrics(metrics_fn, aux["outputs"], targets, mask, extra)
    if not regression:
        metrics["accuracy"] = next(iter(task_metrics.values()))
    metrics.update(task_metrics)
    metrics.update(solver_metrics(aux["stats"], mask))
    return metrics


def make_train_step(
    model: Any,
    metrics_fn: TaskMetrics,
    schedule: optax.Schedule,
    mesh: Mesh,
    *,
    regression: bool = False,
    regularizer: JacobianRegularizer | None = None,
    interventions: PathIndependence | None = None,
    extras: tuple[str, ...] = (),
    loss_fn: TaskLoss | None = None,
    state_sharding: Any = None,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds ``train_step(state, batch) -> (state, metrics)``, jitted over ``mesh``.

    Args:
      model: the linen model (see the module docstring).
      metrics_fn: the task's metrics, ``(outputs, targets, mask, **extras) -> dict``.
      schedule: the learning-rate schedule, reported as ``learning_rate``.
      mesh: the run's mesh; the batch is split over data x fsdp.
      regression: mean squared error instead of cross-entropy (no ``accuracy``).
      regularizer: the Jacobian regulariser; ``None`` or a disabled one adds nothing.
        Its term counts on the steps its draw picks (`drawn_gradients`; on CPU devices,
        `branches_are_slow`, computed every step and masked, with the same loss,
        gradients and metrics while the term is finite).
      interventions: the path-independence interventions (randomised forward budget,
        alignment penalty); ``None`` means none.
      extras: batch keys handed to the model and to ``metrics_fn`` as keywords (the
        task's ``batch_extras``, e.g. a graph's adjacency).
      loss_fn: the task's loss (`TaskLoss`, e.g. `ClrsTask.loss`), called with the
        batch's ``inputs`` and ``extras`` as keywords; ``None``: the cross-entropy (or,
        with ``regression``, the squared error) over every output.
      state_sharding: the shardings of the state (`sharding.shardings_of` a placed
        state: parameters and optimiser state over fsdp and tensor); ``None``:
        replicated.

    Per-example losses ``[B]`` a model sows as `AUX_LOSS` add their mean over the real
    examples (reported as ``aux_loss``); its `AUX_OUTPUTS` go to ``loss_fn``.

    Returns:
      The jitted step (the state is donated). ``metrics`` (scalars) holds ``loss``
      (the optimised loss), ``task_loss``, the task's metrics, ``accuracy`` (the first
      of those, for classification), the forward solver's statistics and those of
      `apply_update`; with the spectral hinge on, ``spectral_estimate`` (the mean
      estimated ``rho``) and ``spectral_hinge`` (before ``spectral_weight``); with a
      randomised budget ``train_budget``; with the alignment penalty ``alignment_term``.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """
    model = sharding.place_solve(model, mesh)  # the solve's state over data x fsdp
    reg = regularizer or JacobianRegularizer()
    pi = interventions or PathIndependence()
    jacobian = reg.jacobian_term()
    # Evaluated on every step; the Jacobian term only where its Bernoulli draw says so.
    always = reg.spectral_terms() + pi.terms()
    plain = with_terms(model, always)
    regularised = plain if jacobian is None else with_terms(model, (jacobian, *always))
    terms = net_terms(regularised)  # the model's own terms first
    task_loss_of = _loss_of(loss_fn, regression)

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        k_jacobian, k_draw, k_budget = jax.random.split(step_key(state), 3)
        rngs = {**state.step_rngs(*RNG_STREAMS), JACOBIAN_STREAM: k_jacobian}
        objective = _objective(state, batch, extras, terms, jacobian, rngs, task_loss_of)
        budget_index = pi.draw_budget(k_budget) if pi.budgets else None
        budgeted = _budgeted(objective, state, pi.budgets, budget_index)
        slow = branches_are_slow(mesh)
        result, applied = drawn_gradients(
            reg, k_draw, state.step, budgeted, regularised, plain, gate=slow
        )
        (loss, aux), _ = result
        extra = {k: batch[k] for k in extras}
        metrics = _step_metrics(loss, aux, metrics_fn, batch, extra, regression)
        if pi.budgets:
            metrics["train_budget"] = jnp.asarray(pi.budgets, jnp.float32)[budget_index]
        return apply_update(state, result, metrics, schedule, reg, applied, aux["model_state"])

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    placed = repl if state_sharding is None else state_sharding
    return jax.jit(
        train_step, in_shardings=(placed, data), out_shardings=(placed, repl), donate_argnums=0
    )


def make_spectral_step(
    model: Any, mesh: Mesh, iters: int, extras: tuple[str, ...] = ()
) -> Callable[[TrainState, dict[str, jax.Array]], dict[str, jax.Array]]:
    """Builds ``spectral_step(state, batch) -> {"spectral_radius"}``, jitted over ``mesh``.

    Solves in training mode (the train budget and randomness of this step) and averages
    the power-method estimate of ``rho(J_f(z*))`` (``iters`` iterations) over the real
    examples: the stability diagnostic of Bai et al., logged over training. What training
    mode updates besides (a batch norm's statistics) is dropped: the step reads the
    state and changes nothing.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021.
    """

    probe = with_terms(sharding.place_solve(model, mesh), (SpectralRadius(iters=iters),))

    def spectral_step(state: TrainState, batch: dict[str, jax.Array]):
        rngs = {**state.step_rngs(*RNG_STREAMS), JACOBIAN_STREAM: step_key(state)}
        _, new_state = probe.apply(
            state.variables(state.params),  # the weights being trained, not their average
            batch["inputs"],
            train=True,
            rngs=rngs,
            # batch statistics update in training mode; the diagnostic drops the update
            mutable=[*state.model_state, INTERMEDIATES],
            **{k: batch[k] for k in extras},
        )
        rho = sown(new_state[INTERMEDIATES], SpectralRadius.name)  # [B]
        return {"spectral_radius": masked_mean(rho, batch["mask"])}

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    # the state where it lies (replicated, or placed by the partition rules)
    return jax.jit(spectral_step, in_shardings=(None, data), out_shardings=repl)


def make_eval_step(
    model: Any,
    metrics_fn: TaskMetrics,
    mesh: Mesh,
    max_iter: int | None = None,
    *,
    regression: bool = False,
    extras: tuple[str, ...] = (),
    settle: SettleRule | None = None,
) -> Callable[[TrainState, dict[str, jax.Array]], dict[str, jax.Array]]:
    """Builds ``eval_step(state, batch) -> metrics`` at the solver budget ``max_iter``.

    Args:
      model: the linen model.
      metrics_fn: the task's metrics.
      mesh: the data-parallel mesh.
      max_iter: the solver budget; ``None`` keeps the model's eval budget.
      regression: mean squared error instead of cross-entropy as ``loss``.
      extras: batch keys handed to the model and the metrics as keywords.
      settle: with ``settle.patience > 0`` (``None``: 0), each sample's solve also stops once the
        model's decoded answer (the argmax of its outputs) has not changed for that
        many evaluations (`SettleRule`, `deq_jax.analysis.settled_apply`). A model
        without a `deq_jax.nn.DEQ` is evaluated as usual.

    Returns:
      The jitted step. ``metrics`` holds ``loss``, the task's metrics, the solver
      metrics and ``count`` (real examples in the batch), for `combine`.
    """
    model = sharding.place_solve(model, mesh)
    loss_of = regression_loss if regression else classification_loss
    settle = settle or SettleRule()
    if settle.patience and regression:
        raise ValueError(
            "deq.settle_patience stops a solve when the argmax of the outputs settles; "
            "a regression task has no discrete answer (set it to 0)."
        )

    def eval_step(state: TrainState, batch: dict[str, jax.Array]):
        inputs, targets, mask = batch["inputs"], batch["targets"], batch["mask"]
        extra = {k: batch[k] for k in extras}
        outputs, stats = settle.apply(
            model,
            state.variables(),
            inputs,
            max_iter=max_iter,
            rngs=state.step_rngs(*RNG_STREAMS),
            **extra,
        )
        metrics = {"loss": loss_of(outputs, targets, mask)}
        metrics.update(_task_metrics(metrics_fn, outputs, targets, mask, extra))
        metrics.update(solver_metrics(stats, mask))
        metrics["count"] = jnp.sum(mask.astype(jnp.int32))
        return metrics

    repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    # the state where it lies (replicated, or placed by the partition rules)
    return jax.jit(eval_step, in_shardings=(None, data), out_shardings=repl)
