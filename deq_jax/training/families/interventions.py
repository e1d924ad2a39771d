"""Training interventions that promote path independence, as a config section.

`PathIndependence` is built from ``config.path_independence`` and read by the train
step. Two of the interventions of Anil et al. live here; the others are choices made
elsewhere in the config:

* Randomised forward budget: each training step solves with a budget drawn uniformly
  from ``budget_choices`` evenly spaced integers in ``[budget_min, budget_max]``
  (``budget_max = 0``: off, ``deq.train_max_iter`` always). Each budget is a
  branch of a `jax.lax.switch`, compiled once; only the drawn one runs.
* Fixed-point alignment penalty: with ``alignment_weight > 0`` the DEQ solves every
  input a second time from a fresh standard Gaussian start and the loss gains
  ``alignment_weight * mean_b (1 - cos(z*_b, z*'_b))``, which rewards the dot product
  of the two (normalised) fixed points. With ``deq.z_init = "normal"`` both starts are
  Gaussian, the paper's form.
* Mixed initialisation is ``deq.z_init = "mixed"``; "unroll + backprop" is
  ``deq.solver.name = "fixed_point_iteration"``, ``deq.solver.full_budget = True`` (a
  fixed depth) and ``deq.backward.name = "unrolled"``; implicit gradients are
  ``deq.backward.name = "ift"``; phantom gradients are ``deq.backward.name =
  "phantom"``.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022
  (Section 5: mixed initialisation, randomised depth, the alignment penalty).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax._sections import from_section
from deq_jax.regularizers.terms import Alignment, Term


@dataclasses.dataclass(frozen=True)
class PathIndependence:
    """What the train step needs to know about the path-independence interventions.

    Its field defaults are the one home of the ``config.path_independence`` defaults:
    ``configs/default.py`` builds that section from them.

    Attributes:
      budget_min: the smallest training solver budget of the randomised forward budget.
      budget_max: the largest; 0 turns the randomised budget off.
      budget_choices: how many evenly spaced budgets in ``[budget_min, budget_max]``
        the draw picks from (each is one compiled branch of the train step).
      alignment_weight: weight of the fixed-point alignment penalty (0: off).
    """

    budget_min: int = 1
    budget_max: int = 0
    budget_choices: int = 4
    alignment_weight: float = 0.0

    def __post_init__(self):
        if self.budget_max and not 1 <= self.budget_min <= self.budget_max:
            raise ValueError(
                "path_independence needs 1 <= budget_min <= budget_max for a randomised "
                f"budget, got budget_min={self.budget_min}, budget_max={self.budget_max}."
            )
        if self.budget_max < 0 or self.budget_choices < 1:
            raise ValueError(
                "path_independence.budget_max must be >= 0 and budget_choices >= 1, got "
                f"{self.budget_max} and {self.budget_choices}."
            )
        if self.alignment_weight < 0:
            raise ValueError(
                f"path_independence.alignment_weight must be >= 0, got {self.alignment_weight}."
            )

    @classmethod
    def from_config(cls, section: Any) -> PathIndependence:
        """Builds it from the ``config.path_independence`` section (dict or ConfigDict).

        Raises:
          ValueError: for an unknown key, listing the valid ones, or a bad value.
        """
        return from_section(cls, section, "path_independence")

    @property
    def budgets(self) -> tuple[int, ...]:
        """The training budgets drawn from (empty when the randomised budget is off)."""
        if not self.budget_max:
            return ()
        points = np.linspace(self.budget_min, self.budget_max, self.budget_choices)
        return tuple(sorted({int(round(p)) for p in points}))

    @property
    def alignment(self) -> bool:
        """Whether the alignment penalty is on."""
        return self.alignment_weight > 0

    def terms(self) -> tuple[Term, ...]:
        """The alignment penalty handed to the DEQ (empty when off)."""
        return (Alignment(weight=self.alignment_weight),) if self.alignment else ()

    def draw_budget(self, key: jax.Array) -> jax.Array:
        """The index into `budgets` of one step's budget (uniform)."""
        return jax.random.randint(key, (), 0, len(self.budgets), dtype=jnp.int32)
