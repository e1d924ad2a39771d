"""The coupled, algebraically invertible iteration of reversible DEQs.

McCallum, Arora & Foster iterate two states, ``y`` and ``z``, from ``y_0 = z_0``::

    y_{n+1} = (1 - b) y_n + b f(z_n)
    z_{n+1} = (1 - b) z_n + b f(y_{n+1})

Written as one sequence of the points at which ``f`` is evaluated, ``x_0 = z_0``,
``x_1 = y_1``, ``x_2 = z_1``, ``x_3 = y_2``, ... (and ``x_{-1} = y_0 = z_0``), it is
one recurrence with one evaluation per step::

    x_{k+1} = (1 - b) x_{k-1} + b f(x_k)          (`reversible_step`)

which runs backwards exactly, from the last two points alone::

    x_{k-1} = (x_{k+1} - b f(x_k)) / (1 - b)      (`reversible_unstep`)

So a solve holds ``O(1)`` states whatever its length, and its exact gradient is
computed in reverse by reconstructing each point from the two after it
(`deq_jax.backward.reversible`). Each of the paper's steps (``y`` then ``z``) is two
of these; its ``max_steps = n`` is ``max_iter = 2 n + 1`` evaluations here (the first,
``f(z_0)``, included).

As a `Solver` it runs in the shared loop (`deq_jax.solvers.iterate`) like any other,
with the loop's per-sample stopping and lowest-residual iterate, so it can be paired
with any backward mode. Its exact backward, ``deq_jax.backward.reversible()``, runs its
own loop instead, which returns the iterate each sample stopped on (the gradient must
be that of a fixed computation).

References:
  McCallum, Arora & Foster, "Reversible Deep Equilibrium Models", 2025
  (arXiv:2509.12917).
"""

from __future__ import annotations

import dataclasses

import jax

from deq_jax.solvers.base import Solver


def reversible_step(prev: jax.Array, f_cur: jax.Array, beta: float) -> jax.Array:
    """``x_{k+1} = (1 - beta) x_{k-1} + beta f(x_k)`` from ``prev = x_{k-1}`` and
    ``f_cur = f(x_k)``."""
    return (1.0 - beta) * prev + beta * f_cur


def reversible_unstep(nxt: jax.Array, f_cur: jax.Array, beta: float) -> jax.Array:
    """``x_{k-1} = (x_{k+1} - beta f(x_k)) / (1 - beta)``: `reversible_step` undone,
    from ``nxt = x_{k+1}`` and ``f_cur = f(x_k)``."""
    return (nxt - beta * f_cur) / (1.0 - beta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class reversible(Solver):  # noqa: N801 - registry name is the constructor name
    """The reversible DEQ's coupled iteration, one evaluation of ``f`` per step.

    ``x_{k+1} = (1 - beta) x_{k-1} + beta f(x_k)`` with ``x_{-1} = x_0 = z_0`` (module
    docstring): the paper's ``y``, ``z`` pair as one sequence.

    Attributes:
      beta: the relaxation ``b`` in ``(0, 2)``, not ``1`` (where the step cannot be
        undone). Every backward step divides by ``1 - beta``, so rounding errors grow as
        the steps are undone: the closer ``beta`` is to ``1``, the fewer steps stay
        exact. The default, 0.5 (the paper's language setting; 0.8 on images), keeps
        the float32 gradient within 1e-6 of autodiff's over 8 steps on the tanh and LM
        cells, where 0.8 loses 6e-4 on the LM cell (docs/results/reversible.md).
      tol, max_iter, stop_mode, full_budget: see `Solver`. ``max_iter`` counts the
        evaluations of ``f`` (the paper's ``max_steps = n`` is ``max_iter = 2 n + 1``).
    """

    beta: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.beta < 2 or self.beta == 1:
            raise ValueError(
                f"beta must lie in (0, 2) and differ from 1 (the reversible step divides "
                f"by 1 - beta), got {self.beta!r}."
            )

    def init(self, z0):
        return z0  # x_{-1} = y_0 = z_0

    def propose(self, aux, z, fz, k):
        return reversible_step(aux, fz, self.beta), z
