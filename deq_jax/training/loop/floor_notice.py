"""One line when a run's tolerance is below the residual floor of its cell's precision.

A cell computed in bfloat16 (or in a GPU's or TPU's default arithmetic) cannot push its
residual below a floor near the arithmetic's unit roundoff; each solve measures that
floor and stops there (`deq_jax.solvers.floor`), and the train metrics carry it
(``floor``, ``at_floor``; ``bwd_floor_mean`` and ``bwd_at_floor_fraction`` for the IFT
backward solve). `FloorNotice` reads the logged means and says once per run, in one
line, that the configured tolerance asks for more than the arithmetic resolves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class FloorNotice:
    """Says once when the measured floor lies above the forward tolerance.

    Args:
      tol: the forward solver's ``tol`` (``config.deq.solver.tol``).
      precision: the cell's precision (``config.deq.precision``), named in the line.
      emit: receives the line.
    """

    def __init__(self, tol: float, precision: str, emit: Callable[[str], None]):
        self.tol, self.precision, self.emit = tol, precision, emit
        self.said = False

    def check(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Emits the line the first time ``metrics`` (a log interval's means) show a
        floor above ``tol``; returns whether it did now."""
        floor = metrics.get("floor")
        if self.said or floor is None or not float(floor) > self.tol:
            return False
        self.said = True
        share = float(metrics.get("at_floor", 0.0))
        backward = float(metrics.get("bwd_at_floor_fraction", 0.0))
        self.emit(
            f"Note: at step {step} the cell's precision ({self.precision}) resolves residuals "
            f"down to about {float(floor):.1e} (the floor each solve measured), above "
            f"deq.solver.tol={self.tol:g}: {share:.0%} of the forward and {backward:.0%} of "
            f"the backward solves stopped at the floor instead of the tolerance. Set "
            f"deq.solver.tol to about {float(floor):.0e} to say so, or deq.precision=float32 "
            "to resolve it."
        )
        return True
