"""The per-sample shape of a DEQ state as a neural solver sees it: one array or several.

A neural solver is built for one kind of state and reads its layout from a
``state_shape``:

* one array: a tuple of ints, channels last: ``(D,)`` for vectors, ``(L, C)`` for
  sequences, ``(H, W, C)`` for images;
* a multiscale state (`deq_jax.models.mdeq.MDEQ`: one feature map per resolution, a
  tuple of arrays): a tuple of such shapes, one per leaf in the state's flattening
  order, e.g. ``((28, 28, 8), (14, 14, 16))``.

The solver compresses each residual to one vector per sample: the channel-wise mean of
an array, or the channel-wise means of every resolution, concatenated (``sum_i C_i``
values), as in the neural solvers of Bai et al. (2022) for MDEQ.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4, the
  multiscale models).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

# A state shape: a tuple of ints (one array) or a tuple of tuples of ints (several).
StateShape = tuple


def is_multiscale(state_shape: Any) -> bool:
    """Whether ``state_shape`` describes several arrays (a tuple of shapes)."""
    return (
        isinstance(state_shape, Sequence)
        and len(state_shape) > 0
        and all(isinstance(s, Sequence) for s in state_shape)
    )


def _ints(shape: Any, what: str) -> tuple[int, ...]:
    out = tuple(shape)
    if not out or not all(isinstance(s, int | np.integer) and s >= 1 for s in out):
        raise ValueError(f"{what} must be a non-empty tuple of positive ints, got {shape!r}.")
    return tuple(int(s) for s in out)


def check_state_shape(state_shape: Any) -> StateShape:
    """``state_shape`` as a tuple of ints or a tuple of tuples of ints (from lists too,
    e.g. read back from JSON).

    Raises:
      ValueError: for anything else (empty, non-positive or mixed entries).
    """
    if is_multiscale(state_shape):
        return tuple(_ints(s, "Each shape of a multiscale state_shape") for s in state_shape)
    return _ints(state_shape, "state_shape")


def leaf_shapes(state_shape: StateShape) -> tuple[tuple[int, ...], ...]:
    """The per-leaf shapes: ``state_shape`` itself for a multiscale state, else
    ``(state_shape,)``."""
    return tuple(state_shape) if is_multiscale(state_shape) else (tuple(state_shape),)


def pooled_channels(state_shape: StateShape) -> int:
    """The size of a pooled residual: the channels ``C`` of one array, ``sum_i C_i`` of
    a multiscale state."""
    return sum(shape[-1] for shape in leaf_shapes(state_shape))


def state_size(state_shape: StateShape) -> int:
    """Values per sample (the flat ``D`` of the solvers)."""
    return sum(math.prod(shape) for shape in leaf_shapes(state_shape))


def state_shape_of(z: Any) -> StateShape:
    """The per-sample `StateShape` of a batched state: one array ``[B, ...]`` or a
    tuple/list of arrays ``[B, ...]`` (a multiscale state).

    Raises:
      ValueError: for another pytree (a dict, a nested tuple) or a leaf without a
        batch axis.
    """
    if isinstance(z, tuple | list):
        leaves = list(z)
        if not leaves or not all(hasattr(x, "shape") and len(x.shape) >= 2 for x in leaves):
            raise ValueError(
                "A multiscale state must be a tuple of batched arrays [B, ...]; got "
                f"{jax.tree_util.tree_structure(z)}."
            )
        return tuple(tuple(int(s) for s in x.shape[1:]) for x in leaves)
    if not hasattr(z, "shape") or len(z.shape) < 2:
        raise ValueError(
            "A neural solver needs a state that is one batched array [B, ...] or a tuple "
            f"of them; got {jax.tree_util.tree_structure(z)}."
        )
    return tuple(int(s) for s in z.shape[1:])


def to_json(state_shape: StateShape) -> list:
    """``state_shape`` as JSON-ready lists (`check_state_shape` reads them back)."""
    if is_multiscale(state_shape):
        return [list(s) for s in state_shape]
    return list(state_shape)
