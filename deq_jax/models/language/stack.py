"""The explicit modes of `DEQTransformerLM`: cells applied a fixed number of times.

``weight_tied`` applies one cell ``n_layer`` times, ``unrolled`` (in training) applies
it ``unroll_steps`` times and keeps some intermediate states for the fixed-point
correction loss, ``untied`` applies ``n_layer`` cells once each. The unrolls themselves
are the generic `deq_jax.nn.unroll.run_tied` and `run_untied` (re-exported here): every
application gets the same ``"dropout"`` key (for ``untied`` one key per block), as the
DEQ hands one key to every iteration of its solve, so a weight-tied stack sees one
dropout mask at every depth, as in locuslab/deq's pre-training. The statistics mimic a
solver's: ``nstep`` is the depth and the residual is that of the last step. A
weight-tied stack is a `jax.lax.scan`, so the cell is compiled once whatever the depth.
This module adds the correction loss's schedule (`correction_steps`,
`correction_weights`).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the
  fixed-point correction).
"""

from __future__ import annotations

import math

from deq_jax.nn.unroll import run_tied, run_untied

__all__ = ["correction_steps", "correction_weights", "run_tied", "run_untied"]


def correction_steps(steps: int, states: int) -> tuple[int, ...]:
    """The steps (1-based) whose states enter the correction loss: ``states`` of them,
    evenly spaced, the last one ``steps``; e.g. ``(3, 6)`` for 6 steps and 2 states."""
    states = min(states, steps)
    return tuple(math.ceil((s + 1) * steps / states) for s in range(states))


def correction_weights(states: int, gamma: float) -> tuple[float, ...]:
    """``gamma ** (states - 1 - s)`` for ``s = 0, ..., states - 1`` (the last weighs 1)."""
    return tuple(gamma ** (states - 1 - s) for s in range(states))
