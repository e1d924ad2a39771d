"""The Jacobian regulariser as a training option: weight schedule, frequency, probes.

`JacobianRegularizer` is built from ``config.regularizer`` and turned by the train step
into penalty terms handed to the DEQ (`deq_jax.regularizers.terms`): at step ``t`` it
adds ``gamma_t * mean_b term_b`` to the loss, where ``term_b`` is the Hutchinson
estimate of ``||J_f(z*_b)||_F^2 / d`` that the
`deq_jax.nn.DEQ` sows with ``jacobian_samples`` probes, ``gamma_t`` ramps linearly from
``jacobian_weight_start`` to ``jacobian_weight`` over ``jacobian_weight_steps`` steps,
and the term is computed only on steps where a Bernoulli(``jacobian_freq``) draw says so
(the paper's way of paying for it on a fraction of the steps) and, with
``jacobian_stop_step > 0``, only before that step (locuslab's ``JAC_STOP_EPOCH``: the
late steps train on the task loss alone). The spectral radius of
``J_f(z*)`` is a diagnostic logged every ``spectral_every`` steps.

With ``spectral_weight > 0`` the loss also gets
``spectral_weight * mean_b max(0, rho_b - spectral_target)^2``, where ``rho_b`` is the
power-method estimate of ``rho(J_f(z*_b))`` of
`deq_jax.regularizers.spectral_radius_penalty_estimate` (``spectral_penalty_iters``
detached steps, two differentiated), on every step. The Frobenius term averages over
all ``d`` directions of the state, so a few directions that grow past 1 barely move it;
the hinge on ``rho`` acts on exactly those, and on nothing while ``rho`` stays below the
target.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Section 4: the weight ``gamma``, the frequency ``p`` and the ``M``
  Hutchinson probes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax._sections import from_section
from deq_jax.regularizers.terms import JacobianTerm, SpectralHinge, Term


@dataclasses.dataclass(frozen=True)
class JacobianRegularizer:
    """What the train step needs to know about the Jacobian regulariser.

    Its field defaults are the one home of the ``config.regularizer`` defaults:
    ``configs/default.py`` builds that section from them.

    Attributes:
      jacobian_weight: ``gamma`` after the ramp (0 and a zero start: off).
      jacobian_weight_start: ``gamma`` at step 0.
      jacobian_weight_steps: steps of the linear ramp from the start weight to
        ``jacobian_weight``; 0 means ``jacobian_weight`` from the first step.
      jacobian_freq: ``p``, the probability that a step computes the term.
      jacobian_stop_step: no term from this step on (0: never stops). Counted from the
        first step, warm-up included, as locuslab's ``JAC_STOP_EPOCH``.
      jacobian_samples: ``M``, Hutchinson probes per example.
      spectral_every: log the power-method spectral radius every this many steps
        (0: never).
      spectral_iters: power-method iterations of that estimate.
      spectral_weight: weight of the squared hinge on the spectral radius (0: off).
      spectral_target: the radius below which the hinge is zero.
      spectral_penalty_iters: detached power steps of the penalised estimate.
    """

    jacobian_weight: float = 0.0
    jacobian_weight_start: float = 0.0
    jacobian_weight_steps: int = 0
    jacobian_freq: float = 1.0
    jacobian_stop_step: int = 0
    jacobian_samples: int = 1
    spectral_every: int = 0
    spectral_iters: int = 20
    spectral_weight: float = 0.0
    spectral_target: float = 1.0
    spectral_penalty_iters: int = 10

    def __post_init__(self):
        if self.jacobian_weight < 0 or self.jacobian_weight_start < 0:
            raise ValueError(
                "regularizer.jacobian_weight and jacobian_weight_start must be >= 0, got "
                f"{self.jacobian_weight} and {self.jacobian_weight_start}."
            )
        if not 0.0 <= self.jacobian_freq <= 1.0:
            raise ValueError(
                f"regularizer.jacobian_freq must lie in [0, 1], got {self.jacobian_freq}."
            )
        if self.spectral_weight < 0:
            raise ValueError(
                f"regularizer.spectral_weight must be >= 0, got {self.spectral_weight}."
            )
        if self.spectral_target <= 0:
            raise ValueError(
                f"regularizer.spectral_target must be > 0, got {self.spectral_target}."
            )
        for name in ("jacobian_samples", "spectral_iters", "spectral_penalty_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"regularizer.{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("jacobian_weight_steps", "jacobian_stop_step", "spectral_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"regularizer.{name} must be >= 0, got {getattr(self, name)}.")

    @classmethod
    def from_config(cls, section: Any) -> JacobianRegularizer:
        """Builds it from the ``config.regularizer`` section (a dict or ConfigDict).

        Raises:
          ValueError: for an unknown key, listing the valid ones, or a bad value.
        """
        return from_section(cls, section, "regularizer")

    @property
    def enabled(self) -> bool:
        """Whether the term is ever added to the loss."""
        weighted = self.jacobian_weight > 0 or self.jacobian_weight_start > 0
        return weighted and self.jacobian_freq > 0

    @property
    def spectral_enabled(self) -> bool:
        """Whether the spectral-radius hinge is added to the loss."""
        return self.spectral_weight > 0

    def jacobian_term(self) -> JacobianTerm | None:
        """The Jacobian penalty handed to the DEQ (``None`` when off): ``M`` probes, the
        weight ramped from ``jacobian_weight_start`` to ``jacobian_weight``."""
        if not self.enabled:
            return None
        return JacobianTerm(
            samples=self.jacobian_samples,
            weight=self.jacobian_weight,
            weight_start=self.jacobian_weight_start,
            weight_steps=self.jacobian_weight_steps,
        )

    def spectral_terms(self) -> tuple[Term, ...]:
        """The spectral-radius hinge handed to the DEQ on every step (empty when off)."""
        if not self.spectral_enabled:
            return ()
        return (
            SpectralHinge(
                iters=self.spectral_penalty_iters,
                target=self.spectral_target,
                weight=self.spectral_weight,
            ),
        )

    @property
    def drawn(self) -> bool:
        """Whether some steps skip the term: ``p < 1`` or a stop step."""
        return self.jacobian_freq < 1.0 or self.jacobian_stop_step > 0

    def draw(self, key: jax.Array, step: jax.Array) -> jax.Array:
        """Whether step ``step`` computes the term: its Bernoulli(``jacobian_freq``)
        draw, and false from ``jacobian_stop_step`` on."""
        draw = jax.random.bernoulli(key, self.jacobian_freq)
        if self.jacobian_stop_step > 0:
            draw = draw & (step < self.jacobian_stop_step)
        return draw

    def weight_at(self, step: jax.Array) -> jax.Array:
        """The reported weight ``gamma_t`` at ``step``: the ramp, 0 from the stop step
        (and always 0 with the regulariser off)."""
        term = self.jacobian_term()
        if term is None:
            return jnp.zeros((), jnp.float32)
        weight = term.weight_at(step)
        if self.jacobian_stop_step > 0:
            weight = jnp.where(step < self.jacobian_stop_step, weight, 0.0)
        return weight
