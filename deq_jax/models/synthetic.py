"""The 200-parameter DEQ of the synthetic 1-D experiment of Bai et al. (2021).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Section 5.1, the synthetic experiment).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.deq import DEQ
from deq_jax.nn.spec import DEQSpec
from deq_jax.solvers.base import SolverStats


class ScalarReLUCell(nn.Module):
    """``f(z; x) = W2^T ReLU(W1 z + U x + b)`` for a scalar state and a scalar input.

    Parameters (each ``[hidden]``): ``W1``, ``U``, ``b`` and ``W2``; 200 in all with the
    paper's 50 hidden units. ``f`` is piecewise linear in ``z`` with slope
    ``sum_j W2_j W1_j [unit j active]``, so its Jacobian is that scalar.

    Attributes:
      hidden: hidden units.
      recurrent_std: standard deviation of the initial ``W1``, ``U`` and ``b``.
      out_std: standard deviation of the initial ``W2`` (times ``1 / sqrt(hidden)``).

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (Section 5.1, the synthetic experiment).
    """

    hidden: int = 50
    recurrent_std: float = 1.0
    out_std: float = 0.5

    @nn.compact
    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """``z [B, 1], x [B, 1] -> f(z; x) [B, 1]``."""
        normal = nn.initializers.normal
        w1 = self.param("W1", normal(self.recurrent_std), (self.hidden,))
        u = self.param("U", normal(self.recurrent_std), (self.hidden,))
        b = self.param("b", normal(self.recurrent_std), (self.hidden,))
        w2 = self.param("W2", normal(self.out_std / self.hidden**0.5), (self.hidden,))
        h = nn.relu(z * w1 + x.astype(z.dtype) * u + b)  # [B, hidden]
        return jnp.sum(h * w2, axis=-1, keepdims=True)  # [B, 1]


class Synthetic1DDEQ(nn.Module):
    """The 200-parameter DEQ of the synthetic 1-D experiment: the prediction is ``z*``.

    ``x [B, 1]`` is injected into a `ScalarReLUCell` and the equilibrium
    ``z* = f(z*; x)`` ``[B, 1]`` is returned as the regression output, with no readout,
    as in the paper.

    Attributes:
      hidden: hidden units of the cell (50: 200 parameters).
      recurrent_std: see `ScalarReLUCell`.
      out_std: see `ScalarReLUCell`.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (Section 5.1).
    """

    hidden: int = 50
    recurrent_std: float = 1.0
    out_std: float = 0.5
    deq: DEQSpec = DEQSpec()

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, 1] -> (z* [B, 1], stats)``; ``deq_options`` go to the `DEQ` call."""
        if x.ndim != 2 or x.shape[-1] != 1:
            raise ValueError(f"Synthetic1DDEQ expects inputs [B, 1], got shape {x.shape}.")
        cell = ScalarReLUCell(self.hidden, self.recurrent_std, self.out_std, name="cell")
        return DEQ(cell, spec=self.deq, name="deq")(
            x, train=train, max_iter=max_iter, **deq_options
        )
