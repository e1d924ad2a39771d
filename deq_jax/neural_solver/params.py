"""`FrozenParams`: trained parameters held by value, so a solver stays hashable.

A solver is a frozen, hashable description that rides as a static argument of `jax.jit`
and a non-differentiable argument of `jax.custom_vjp` (see `deq_jax.backward.ift`). A
neural solver also carries trained weights. `FrozenParams` keeps them as read-only
host arrays, hashes and compares them by content, and hands them back as a pytree of
``jax`` arrays; under a trace they become compile-time constants of the solve. Training
never goes through this object: the training functions of `deq_jax.neural_solver` take
the parameters as an explicit (traced) argument instead.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class FrozenParams:
    """An immutable, content-hashed pytree of parameters.

    Args:
      tree: a pytree of concrete arrays (e.g. a Flax ``variables`` dict). Tracers are
        refused: a solver's weights are fixed when the solver is built.

    Raises:
      ValueError: if a leaf is a tracer (pass traced parameters to the training
        functions' ``params`` argument instead).
    """

    __slots__ = ("_treedef", "_leaves", "_key")

    def __init__(self, tree: Any):
        if isinstance(tree, FrozenParams):
            self._treedef, self._leaves, self._key = tree._treedef, tree._leaves, tree._key
            return
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        host = []
        digest = hashlib.sha256()
        for leaf in leaves:
            if isinstance(leaf, jax.core.Tracer):
                raise ValueError(
                    "A neural solver's parameters must be concrete arrays, not tracers: build "
                    "the solver outside jit/grad, and pass traced parameters to the training "
                    "functions (unroll, neural_solver_loss) through their `params` argument."
                )
            arr = np.array(leaf, copy=True)
            arr.setflags(write=False)
            digest.update(f"{arr.dtype}{arr.shape}".encode())
            digest.update(arr.tobytes())
            host.append(arr)
        self._treedef = treedef
        self._leaves = tuple(host)
        self._key = (treedef, digest.hexdigest())

    @property
    def tree(self) -> Any:
        """The parameters as a pytree of ``jax`` arrays (constants under a trace)."""
        return jax.tree_util.tree_unflatten(self._treedef, [jnp.asarray(x) for x in self._leaves])

    @property
    def specs(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        """``(path, shape, dtype name)`` of each leaf, e.g. to check the architecture."""
        return leaf_specs(self.tree)

    @property
    def size(self) -> int:
        """The number of scalar parameters."""
        return sum(x.size for x in self._leaves)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrozenParams) and self._key == other._key

    def __repr__(self) -> str:
        return f"FrozenParams(size={self.size}, sha256={self._key[1][:12]})"


def leaf_specs(tree: Any) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """``(path, shape, dtype name)`` of each leaf of a pytree of arrays or shape structs.

    Paths are `jax.tree_util.keystr` strings, so a ``dict`` and a Flax ``FrozenDict``
    with the same entries have the same specs.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return tuple(
        (jax.tree_util.keystr(path), tuple(x.shape), jnp.dtype(x.dtype).name) for path, x in leaves
    )
