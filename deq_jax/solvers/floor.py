"""The residual floor of a reduced-precision cell: measured once per solve, stopped at.

A cell whose matmuls round their operands (bfloat16: 8 significant bits; TensorFloat-32:
11) rounds the state it is given at every evaluation, so ``f(z)`` jumps as ``z`` moves
within one rounding: a relative error near the arithmetic's unit roundoff ``u`` that no
solver can remove from the residual ``||f(z) - z||``. A tolerance below that floor runs
the whole budget and stalls there.

The solve measures the floor (`deq_jax.solvers.iterate`, with a solver whose ``floor``
is a `Floor`): at its first proposal ``z1`` (the first iterate the solver chose, at the
scale of the fixed point) it evaluates ``f`` once more, at ``z1`` moved by one unit
roundoff (``z1 * (1 + u s)``, ``s`` a fixed pattern of signs), and takes the change,

    floor = ||f(z1 (1 + u s)) - f(z1)|| / ||f(z1)||      (``stop_mode="rel"``; without
                                                          the division for ``"abs"``)

per sample: how far ``f`` moves when its state moves by one rounding, the rounding of
the state and of every intermediate the cell computes included. A sample then stops
once its residual is at most ``max(tol, margin * floor)``: ``margin`` (``Floor``, 1 by
default) is a safety factor on the estimate. On the tanh cell (d 256, contraction 0.9,
bfloat16) the estimate is 2.5e-3 where plain iteration stalls at 6e-4 to 8e-4 and
Anderson at 2e-4 to 4e-4: the estimate is an upper bound of the noise, so ``margin = 1``
stops every solver that reaches the noise. The statistics carry the floor and the samples
that stopped on it (`deq_jax.SolverStats` ``floor`` and ``at_floor``). The measurement
costs one evaluation of ``f`` per solve; a solve in true float32 (``floor=None``) does
not make it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from deq_jax.precision import unit_roundoff

# The seed of the sign pattern that moves the state by one rounding.
_PATTERN_SEED = 0x5EED


@dataclasses.dataclass(frozen=True)
class Floor:
    """How a solve measures and uses its residual floor (module docstring).

    Attributes:
      unit: the unit roundoff of the cell's matmuls (`deq_jax.precision.unit_roundoff`:
        ``2**-8`` for bfloat16, ``2**-11`` for TensorFloat-32).
      margin: a sample stops once its residual is at most ``max(tol, margin * floor)``.
    """

    unit: float
    margin: float = 1.0

    def __post_init__(self):
        if not 0 < self.unit < 1:
            raise ValueError(f"Floor.unit must be in (0, 1), got {self.unit!r}.")
        if not self.margin > 0:
            raise ValueError(f"Floor.margin must be positive, got {self.margin!r}.")


def moved_by_one_rounding(z: jax.Array, unit: float) -> jax.Array:
    """``z [B, D]`` with every entry moved by ``unit`` of itself, up or down by a fixed
    pattern of signs."""
    signs = jax.random.rademacher(jax.random.PRNGKey(_PATTERN_SEED), z.shape, z.dtype)
    return z * (1 + unit * signs)


def stopping_tolerance(tol: float, floor: jax.Array, margin: float) -> jax.Array:
    """``[B]``: the residual each sample stops at, ``max(tol, margin * floor)``."""
    return jnp.maximum(tol, margin * floor)


def floor_of(precision: str, backend: str | None = None) -> Floor | None:
    """The floor rule of a cell computed in ``precision`` (`deq_jax.precision`) on
    ``backend`` (``None``: JAX's default): ``None`` where its matmuls are true float32."""
    unit = unit_roundoff(precision, backend)
    return None if unit is None else Floor(unit)
