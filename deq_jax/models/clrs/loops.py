"""The loops of `deq_jax.models.clrs.model` that are not a DEQ solve.

* `unroll_to_fixed_point`: ``z <- f(z)`` per sample until its residual passes the
  solver's test, as a `jax.lax.scan`, so gradients flow back through every step (the
  ``"hint_propagation"`` mode), with the step penalty ``sum_t ||z_{t+1} - z_t||^2``.
* `ClrsStep` and `run_fixed_steps`: CLRS's hint-supervised loop over an algorithm's true
  number of steps (the ``"fixed_steps"`` mode): encode the fed hints, run the processor,
  decode the next hints, score them and feed them back.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/nets.py``: the hint loop, soft hint re-prediction, teacher forcing).
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024 blog
  post track.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax._flat import flat_fn, flatten, layout_of, unflatten
from deq_jax.models.clrs.decoders import FeatureDecoder, feedback
from deq_jax.models.clrs.encoders import FeatureEncoder, FeatureSpec, dense_value
from deq_jax.models.clrs.losses import feature_loss
from deq_jax.models.clrs.processors import ProcessorInputs, make_processor
from deq_jax.solvers.base import SolverStats
from deq_jax.solvers.fixed_point_iteration import fixed_point_iteration
from deq_jax.solvers.loop import iterate_unrolled


def per_sample_norm(x: jax.Array) -> jax.Array:
    """``||x_b||_2`` over every axis but the first: ``[B]``; its gradient at 0 is 0."""
    squares = jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)))  # [B]
    positive = squares > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squares, 1.0)), 0.0)


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
    """``mask [B]`` broadcast against ``x [B, ...]``."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def unroll_to_fixed_point(
    f: Callable[[jax.Array, Any], jax.Array],
    z0: Any,
    args: Any,
    *,
    max_iter: int,
    tol: float,
    stop_mode: str = "rel",
) -> tuple[Any, SolverStats, jax.Array]:
    """``z <- f(z, args)`` per sample until converged, reverse-differentiable.

    Plain iteration run by `deq_jax.solvers.iterate_unrolled` (the solvers' loop as a
    `jax.lax.scan`): each sample stops (and is frozen) once its residual ``||f(z) - z||``
    (``"abs"``, or that over ``||f(z)|| + REL_EPS`` for ``"rel"``) is at most ``tol``,
    turns non-finite (diverged; the last finite iterate is kept) or ``max_iter``
    evaluations are spent.

    Returns:
      ``(z, stats, penalty)``: ``f`` at the iterate each sample stopped on (the state
      pytree of ``z0``), `SolverStats` (``nstep`` the evaluations of ``f``, the lowest
      residuals, ``trace [B, max_iter]``) and the step penalty
      ``sum_t ||z_{t+1} - z_t||^2`` ``[B]``, differentiable.
    """
    layout = layout_of(z0, batched=True)
    solver = fixed_point_iteration(tol=tol, max_iter=max_iter, stop_mode=stop_mode)
    z, stats, penalty = iterate_unrolled(solver, flat_fn(f, layout, args), flatten(z0, layout))
    return unflatten(z, layout), stats, penalty


class ClrsStep(nn.Module):
    """One step of ``fixed_steps``: encode the fed hints, run the processor, decode hints.

    Attributes:
      hints: the hint features.
      hidden: the width ``H``.
      processor: the processor's name; ``processor_kwargs`` its attributes.
    """

    hints: tuple[FeatureSpec, ...]
    hidden: int
    processor: str
    processor_kwargs: tuple[tuple[str, Any], ...]

    @nn.compact
    def __call__(self, z: jax.Array, fed: dict[str, jax.Array], base: ProcessorInputs):
        """``z [B, n, H]``, fed hints, encoded inputs -> ``(z', {hint: logits})``."""
        b, n = z.shape[:2]
        encoded = FeatureEncoder(self.hints, self.hidden, name="hint_encoder")(fed, b, n)
        x = ProcessorInputs(
            base.node + encoded.node,
            base.edge + encoded.edge,
            base.graph + encoded.graph,
            base.adjacency,
        )
        cell = make_processor(self.processor, name="cell", **dict(self.processor_kwargs))
        z_new = cell(z, x)
        h = jnp.concatenate([x.node, z_new], axis=-1)  # [B, n, 2H]
        logits = FeatureDecoder(self.hints, self.hidden, name="hint_decoder")(h, x.edge, x.graph)
        return z_new, logits


def run_fixed_steps(
    step: Callable[[jax.Array, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]],
    z: jax.Array,
    hints: Mapping[str, jax.Array],
    lengths: jax.Array,
    specs: tuple[FeatureSpec, ...],
    *,
    train: bool,
    feedback_mode: str = "soft",
    key: jax.Array | None = None,
    teacher_forcing: float = 0.0,
    gumbel_tau: float = 1.0,
) -> tuple[jax.Array, SolverStats, jax.Array, jax.Array]:
    """Runs ``max(length - 1, 1)`` processor steps per example, feeding hints back.

    Step ``t`` reads the fed hints (the truth at ``t = 0``, then `feedback` of the
    decoded ones, or the truth with probability ``teacher_forcing``) and its decoded
    hints are scored against the truth at ``t + 1`` where ``t + 1 < length``. An
    example's state is frozen after its own steps. Training scans over the trajectory's
    ``T - 1`` steps (reverse-differentiable); evaluation runs a `jax.lax.while_loop` to
    the batch's longest run, so it needs only the hints of step 0.

    Args:
      step: ``(z [B, n, H], fed) -> (z', {hint: logits})``, e.g. an applied `ClrsStep`.
      z: the initial state.
      hints: ``{name: [B, T, ...]}``, the true trajectories (``T >= 2`` in training).
      lengths: int32 ``[B]``, each example's number of hint steps.
      specs: the hint features.
      train: score the hints and scan (else a while loop, no hint loss).
      feedback_mode: how decoded hints are fed back (`feedback`).
      key: the key of the Gumbel noise and teacher forcing.
      teacher_forcing: the probability of feeding the true hint.
      gumbel_tau: the Gumbel-softmax temperature.

    Returns:
      ``(z, stats, hint_loss [B], penalty [B])``: the final state, `SolverStats`
      (``nstep`` the steps run, the last step's residual), the hint loss averaged over
      the valid steps and ``sum_t ||z_{t+1} - z_t||^2``.
    """
    b, n = z.shape[:2]
    steps = jnp.maximum(lengths - 1, 1)  # [B]
    total = next(iter(hints.values())).shape[1]
    key = jax.random.key(0) if key is None else key
    zeros = jnp.zeros((b,), jnp.float32)
    fed = {f.name: dense_value(f, hints[f.name][:, 0], n) for f in specs}

    def advance(z, fed, t, truth):
        z_new, logits = step(z, fed)
        k_feedback, k_force = jax.random.split(jax.random.fold_in(key, t))
        keys = jax.random.split(k_feedback, len(specs))
        new = {
            f.name: feedback(f, logits[f.name], feedback_mode, k, gumbel_tau)
            for f, k in zip(specs, keys, strict=True)
        }
        if teacher_forcing > 0:
            force = jax.random.bernoulli(k_force, teacher_forcing, (b,))
            for f in specs:
                true = dense_value(f, truth[f.name], n)
                new[f.name] = jnp.where(_rows(force, true), true, new[f.name])
        active = t < steps
        delta = per_sample_norm(z_new - z) * active
        return jnp.where(_rows(active, z), z_new, z), new, delta, logits

    if train:
        if total < 2:
            raise ValueError("fixed_steps training needs hint trajectories with T >= 2 steps.")
        z, penalty, last, hint_loss = _scan_hint_steps(
            advance, (z, fed, zeros, zeros), hints, lengths, steps, specs
        )
    else:
        if teacher_forcing > 0:
            raise ValueError("Teacher forcing needs the true trajectories: train=True.")
        z, penalty, last = _loop_steps(advance, (z, fed, zeros, zeros), steps)
        hint_loss = zeros
    rel = last / (per_sample_norm(z) + 1e-8)
    finite = jnp.isfinite(last)
    stats = SolverStats(steps, last, rel, finite, ~finite, rel[:, None])
    return z, stats, hint_loss, penalty


def _scan_hint_steps(
    advance: Callable[..., tuple[Any, ...]],
    carry: tuple[Any, ...],
    hints: Mapping[str, jax.Array],
    lengths: jax.Array,
    steps: jax.Array,
    specs: tuple[FeatureSpec, ...],
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Scans the ``T - 1`` training steps: ``(z, penalty, last residual, hint loss)``."""
    total = next(iter(hints.values())).shape[1]
    truths = {k: jnp.moveaxis(v[:, 1:], 1, 0) for k, v in hints.items()}  # [T - 1, B, ...]

    def body(carry, xs):
        z, fed, penalty, last = carry
        t, truth = xs
        z, fed, delta, logits = advance(z, fed, t, truth)
        loss = sum(feature_loss(f, logits[f.name], truth[f.name]) for f in specs)
        valid = (t + 1 < lengths).astype(jnp.float32)
        last = jnp.where(t < steps, delta, last)
        return (z, fed, penalty + jnp.square(delta), last), (loss * valid, valid)

    carry, (losses, valid) = jax.lax.scan(body, carry, (jnp.arange(total - 1), truths))
    z, _, penalty, last = carry
    hint_loss = losses.sum(axis=0) / jnp.maximum(valid.sum(axis=0), 1.0)  # [B]
    return z, penalty, last, hint_loss


def _loop_steps(
    advance: Callable[..., tuple[Any, ...]], carry: tuple[Any, ...], steps: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Loops to the batch's longest run (evaluation): ``(z, penalty, last residual)``."""

    def loop(carry):
        t, z, fed, penalty, last = carry
        z, fed, delta, _ = advance(z, fed, t, None)
        return t + 1, z, fed, penalty + jnp.square(delta), jnp.where(t < steps, delta, last)

    carry = (jnp.zeros((), jnp.int32), *carry)
    carry = jax.lax.while_loop(lambda c: c[0] < jnp.max(steps), loop, carry)
    _, z, _, penalty, last = carry
    return z, penalty, last
