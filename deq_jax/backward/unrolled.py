"""Plain backpropagation through the solver's iterations (`jax.lax.scan`)."""

from __future__ import annotations

import dataclasses

from deq_jax.backward.base import Backward
from deq_jax.solvers.loop import iterate


@dataclasses.dataclass(frozen=True, kw_only=True)
class unrolled(Backward):  # noqa: N801 - registry name is the constructor name
    """Backprop through every forward iteration, run as a `jax.lax.scan`.

    Memory grows with ``max_iter``; per-sample stopping and the best-iterate choice are
    kept, so the value equals that of the implicit modes.
    """

    def solve(self, fn, z0, params, solver, probe=None):
        return iterate(solver, lambda z: fn(z, params), z0, loop="scan")
