"""Penalty terms on a DEQ's fixed point, handed to the DEQ layer as small objects.

A term is a frozen description (hyper-parameters and a weight) that the `deq_jax.nn.DEQ`
layer evaluates at its fixed point: it receives the cell ``f``, the fixed point ``z*``,
the cell's arguments, a key from its rng stream and a way to solve again from another
start, and returns per-sample values ``[B]`` by name. The layer sows each into
``"intermediates"`` under that name; the train step adds ``weight_at(step) * mean_b
value_b`` for the term's own ``name``, and logs the mean of every value. Terms combine
the way optax's transforms do, as a tuple (`deq_jax.nn.DEQSpec.terms`)::

    spec = DEQSpec(terms=(JacobianTerm(samples=1, weight=2.0), Alignment(weight=1.0)))

A weight of 0 makes a term a diagnostic (logged, never in the loss).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the Jacobian term; the spectral radius as a diagnostic).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (the fixed-point alignment penalty).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from deq_jax import _flat
from deq_jax.regularizers.jacobian import (
    jacobian_frobenius,
    spectral_radius,
    spectral_radius_penalty_estimate,
)

# ``resolve(z0) -> z*'``: the DEQ's solve of the same problem from another start.
Resolve = Callable[[Any], Any]
# The rng streams a term may draw from.
STREAMS = ("jacobian", "z0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Term(abc.ABC):
    """A per-sample penalty (or diagnostic) evaluated at a DEQ's fixed point.

    Attributes:
      weight: the weight of the term in the loss after the ramp (0: a diagnostic).
      weight_start: the weight at step 0 of a linear ramp to ``weight``.
      weight_steps: the steps of that ramp; 0 means ``weight`` from the first step.

    Subclasses set ``name`` (the value the loss weighs, also the metric's name),
    ``outputs`` (every name they sow, ``name`` among them) and ``stream`` (the rng
    stream their key comes from), and implement `__call__`.
    """

    name: ClassVar[str]
    outputs: ClassVar[tuple[str, ...]]
    stream: ClassVar[str] = "jacobian"

    weight: float = 1.0
    weight_start: float = 0.0
    weight_steps: int = 0

    def __post_init__(self):
        if self.weight < 0 or self.weight_start < 0 or self.weight_steps < 0:
            raise ValueError(
                f"{type(self).__name__}: weight, weight_start and weight_steps must be >= 0, "
                f"got {self.weight}, {self.weight_start} and {self.weight_steps}."
            )

    @property
    def penalises(self) -> bool:
        """Whether the term ever enters the loss."""
        return self.weight > 0 or self.weight_start > 0

    def weight_at(self, step: jax.Array) -> jax.Array:
        """The weight at ``step``: the linear ramp from ``weight_start`` to ``weight``."""
        end = jnp.asarray(self.weight, jnp.float32)
        if self.weight_steps == 0:
            return end
        frac = jnp.clip(jnp.asarray(step, jnp.float32) / self.weight_steps, 0.0, 1.0)
        return self.weight_start + (end - self.weight_start) * frac

    @abc.abstractmethod
    def __call__(
        self, f: Callable, z_star: Any, args: Any, key: jax.Array, resolve: Resolve
    ) -> dict[str, jax.Array]:
        """The per-sample values ``{name: [B]}`` at the fixed point ``z_star``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JacobianTerm(Term):
    """The Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` at the detached ``z*``.

    Differentiable w.r.t. the cell's parameters (`jacobian_frobenius`).

    Attributes:
      samples: ``M``, Hutchinson probes per sample.
    """

    name: ClassVar[str] = "jacobian_term"
    outputs: ClassVar[tuple[str, ...]] = ("jacobian_term",)
    samples: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.samples < 1:
            raise ValueError(f"JacobianTerm.samples must be >= 1, got {self.samples}.")

    def __call__(self, f, z_star, args, key, resolve):
        k_term, _ = jax.random.split(key)
        z_star = jax.lax.stop_gradient(z_star)
        return {self.name: jacobian_frobenius(f, z_star, args, k_term, self.samples)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpectralRadius(Term):
    """The power-method spectral radius ``rho(J_f(z*))``, detached: a diagnostic.

    Attributes:
      iters: power iterations.
    """

    name: ClassVar[str] = "spectral_radius"
    outputs: ClassVar[tuple[str, ...]] = ("spectral_radius",)
    weight: float = 0.0
    iters: int = 20

    def __post_init__(self):
        super().__post_init__()
        if self.penalises:
            raise ValueError("SpectralRadius is detached, a diagnostic: its weight must be 0.")
        if self.iters < 1:
            raise ValueError(f"SpectralRadius.iters must be >= 1, got {self.iters}.")

    def __call__(self, f, z_star, args, key, resolve):
        _, k_rho = jax.random.split(key)
        rho = spectral_radius(f, jax.lax.stop_gradient(z_star), args, k_rho, self.iters)
        return {self.name: jax.lax.stop_gradient(rho)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpectralHinge(Term):
    """The squared hinge ``max(0, rho - target)^2`` on the spectral radius of ``J_f(z*)``.

    ``rho`` comes from `spectral_radius_penalty_estimate` (``iters`` detached power
    steps, two differentiated) and is also sown as ``"spectral_estimate"``. The
    Frobenius term averages over every direction of the state, so a few directions
    that grow past 1 barely move it; the hinge acts on exactly those.

    Attributes:
      iters: detached power steps of the estimate.
      target: the radius below which the hinge is zero.
    """

    name: ClassVar[str] = "spectral_hinge"
    outputs: ClassVar[tuple[str, ...]] = ("spectral_estimate", "spectral_hinge")
    iters: int = 10
    target: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.iters < 1 or self.target <= 0:
            raise ValueError(
                f"SpectralHinge needs iters >= 1 and target > 0, got {self.iters}, {self.target}."
            )

    def __call__(self, f, z_star, args, key, resolve):
        k_pen = jax.random.fold_in(key, 2)
        z_star = jax.lax.stop_gradient(z_star)
        rho = spectral_radius_penalty_estimate(f, z_star, args, k_pen, self.iters)  # [B]
        hinge = jnp.square(jax.nn.relu(rho - self.target))
        return {"spectral_estimate": rho, self.name: hinge}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Alignment(Term):
    """The fixed-point alignment penalty ``1 - cos(z*, z*')`` per sample.

    ``z*'`` is the DEQ's solve of the same input from a fresh standard Gaussian start
    (drawn from the ``"z0"`` stream, with the same solver and backward mode); the value
    is differentiable through both solves.
    """

    name: ClassVar[str] = "alignment_term"
    outputs: ClassVar[tuple[str, ...]] = ("alignment_term",)
    stream: ClassVar[str] = "z0"

    def __call__(self, f, z_star, args, key, resolve):
        leaves, treedef = jax.tree_util.tree_flatten(z_star)
        keys = jax.random.split(key, len(leaves) + 1)[1:]  # as `nn.initial_state`'s "normal"
        noise = [jax.random.normal(k, z.shape, z.dtype) for k, z in zip(keys, leaves, strict=True)]
        other = resolve(jax.tree_util.tree_unflatten(treedef, noise))
        return {self.name: 1.0 - _flat.per_sample_cosine(z_star, other)}


def check_terms(terms: Sequence[Term]) -> tuple[Term, ...]:
    """``terms`` as a tuple, checked: `Term` objects with distinct names.

    Raises:
      TypeError: for an object that is not a `Term`.
      ValueError: for two terms of the same name.
    """
    terms = tuple(terms)
    for term in terms:
        if not isinstance(term, Term):
            raise TypeError(f"terms must be deq_jax.regularizers Term objects, got {term!r}.")
    names = [term.name for term in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"Two terms share a name: {', '.join(names)}.")
    return terms


def evaluate_terms(
    terms: Sequence[Term],
    f: Callable,
    z_star: Any,
    args: Any,
    keys: Callable[[str], jax.Array],
    resolve: Resolve,
) -> dict[str, jax.Array]:
    """Every term's values at ``z_star``: ``{name: [B]}``.

    ``keys(stream)`` gives the key of an rng stream; it is asked once per stream that a
    term uses, in the order of `STREAMS`, and every term of a stream gets the same key
    (each derives its own sub-key).
    """
    drawn = {s: keys(s) for s in STREAMS if any(t.stream == s for t in terms)}
    values: dict[str, jax.Array] = {}
    for term in terms:
        values.update(term(f, z_star, args, drawn[term.stream], resolve))
    return values
