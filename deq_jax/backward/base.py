"""The backward-mode protocol: how gradients flow through a fixed-point solve.

A backward mode is a frozen dataclass. `deq_jax.fixed_point` flattens the state and
closure-converts ``f``, then calls ``mode.solve(fn, z0, params, solver, probe)`` where
``fn(z [B, D], params) -> [B, D]`` and ``params`` holds every array that gradients must
reach (the user's ``args`` and any arrays ``f`` closed over). The mode returns
``(z_star [B, D], stats)`` with whatever gradient it stands for; ``z0`` never receives
a gradient.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from deq_jax.solvers.base import Solver, SolverStats
from deq_jax.solvers.floor import Floor

FlatFn = Callable[[jax.Array, Any], jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backward(abc.ABC):
    """Base class of the backward modes."""

    @property
    def name(self) -> str:
        """The registry name of this mode (its constructor's name)."""
        return type(self).__name__

    def check_solver(self, solver: Solver) -> None:
        """Raises `ValueError` where this mode cannot differentiate a solve by ``solver``
        (`deq_jax.fixed_point` and `deq_jax.nn.DEQSpec` call it); every solver passes by
        default."""
        del solver

    def with_floor(self, floor: Floor | None) -> Backward:
        """This mode with its backward solve stopping at the residual floor ``floor``
        (`deq_jax.solvers.floor`) of a reduced-precision cell. Modes without a solve of
        their own, and solvers given a floor already, are returned unchanged."""
        del floor
        return self

    @abc.abstractmethod
    def solve(
        self, fn: FlatFn, z0: jax.Array, params: Any, solver: Solver, probe: Any = None
    ) -> tuple[jax.Array, SolverStats]:
        """Solves ``z = fn(z, params)`` from ``z0`` with this mode's gradient.

        ``probe`` is the optional stats probe (`deq_jax.backward.probe`); modes without
        a backward solve leave it unused, so its gradient is zero.
        """
