"""The known fixed points a neural-solver fit learns from: `TargetStream`.

A fit needs batches of ``(cell args, injection x, z*)`` from a frozen model
(`deq_jax.training.FrozenDEQ`). The paper draws a new batch for every step and solves
it with a classic solver run long; `TargetStream` does that (``pool=0``), or solves a
pool of batches up front and cycles it (``pool=n``, the cheaper recipe used before).
Either way it checks that the targets are fixed points: when the mean relative
residual of the target solves exceeds ``max_residual``, the fit stops with a
`TargetResidualError` (one line: the residual and the remedy). It also counts the
examples and the seconds the target solves took, so the fit's cost can be reported.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2, App. A).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from deq_jax.training.solver_fit.frozen_deq import FrozenDEQ, Targets


class TargetResidualError(ValueError):
    """The target solves of a fit leave a mean relative residual above the threshold:
    what the fit would learn from are not fixed points."""


def residual_error(mean: float, examples: int, max_residual: float, steps: int) -> str:
    """The one line of a `TargetResidualError`: the residual, and the remedies."""
    return (
        f"the fit's targets are not fixed points: their mean relative residual is "
        f"{mean:.2e} over {examples} examples ({steps} Anderson steps), above "
        f"neural_solver.max_target_residual={max_residual:g}. Raise "
        "--config.deq.neural_solver.target_max_iter, or fit the solver to a "
        "Jacobian-regularised DEQ (a :jacobian config), whose fixed points are found."
    )


class TargetStream:
    """An endless iterator of `Targets` for a fit, the target solves checked and timed.

    The first batch is solved on construction (a model whose fixed points are not
    found fails before any fitting, and `first` gives the shapes).

    Args:
      frozen: the frozen model whose target solver gives ``z*``.
      batches: the model's input batches (dicts `FrozenDEQ.targets` takes).
      max_residual: the largest mean relative residual accepted, over every example
        solved so far (checked after each batch).
      pool: ``0``: solve a new batch for every item (fresh batches); ``n > 0``: solve
        ``n`` batches now and cycle them.
      emit: receives a line on the first targets' residual; ``None``: silent.

    Raises:
      TargetResidualError: on construction or while iterating, when the mean relative
        residual of the targets so far exceeds ``max_residual``.
    """

    def __init__(
        self,
        frozen: FrozenDEQ,
        batches: Iterator[dict[str, Any]],
        max_residual: float,
        *,
        pool: int = 0,
        emit: Callable[[str], None] | None = None,
    ):
        self.frozen, self.max_residual, self.pool = frozen, max_residual, pool
        self._batches = iter(batches)
        self.seconds, self.examples, self._sum, self.max = 0.0, 0, 0.0, 0.0
        first = [self._solve() for _ in range(max(pool, 1))]
        if emit is not None:
            what = f"a pool of {pool} batches" if pool else "the first fresh batch"
            emit(
                f"fixed points of {what} ({self.examples} examples): relative residual "
                f"mean {self.mean:.2e}, max {self.max:.2e} "
                f"({frozen.target_solver.max_iter} Anderson steps)"
            )
        self.first = first[0]
        self._items = itertools.cycle(first) if pool else itertools.chain(first)

    @property
    def mean(self) -> float:
        """The mean relative residual of every target solved so far."""
        return self._sum / max(self.examples, 1)

    def summary(self) -> dict[str, Any]:
        """The targets solved so far: how many, their residual, the time it took."""
        return {
            "fresh": not self.pool,
            "examples": self.examples,
            "rel_residual_mean": self.mean,
            "rel_residual_max": self.max,
            "seconds": self.seconds,
        }

    def _solve(self) -> Targets:
        """Solves the next batch; raises `TargetResidualError` on a bad running mean."""
        batch = next(self._batches, None)
        if batch is None:
            raise ValueError(f"The model's batches ran out after {self.examples} examples.")
        began = time.perf_counter()
        targets = self.frozen.targets(batch)  # rel_residual on the host: the solve is done
        self.seconds += time.perf_counter() - began
        rel = np.asarray(targets.rel_residual, np.float64)
        self.examples += rel.size
        self._sum += float(rel.sum())
        self.max = max(self.max, float(rel.max()))
        if not self.mean <= self.max_residual:
            steps = self.frozen.target_solver.max_iter
            raise TargetResidualError(
                residual_error(self.mean, self.examples, self.max_residual, steps)
            )
        return targets

    def __iter__(self) -> TargetStream:
        return self

    def __next__(self) -> Targets:
        item = next(self._items, None)
        return self._solve() if item is None else item
