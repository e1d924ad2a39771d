"""`FrozenDEQ`: a trained task model's DEQ, frozen, as the training data of a neural solver.

A neural solver is trained with the DEQ fixed: it needs the cell as a pure function
``f(z, args)``, the injected input ``x`` its initialiser reads, and the true fixed
points ``z*``. `FrozenDEQ` takes any task model holding a `deq_jax.nn.DEQ` (through
`deq_jax.nn.deq_call`, so no model code changes), solves each batch to high
accuracy with a classic solver run long (Anderson, 60+ steps by default), checks the
residual and hands back ``(args, x, z*)``. It also builds a solver and initialiser sized
for the model's state, and swaps a trained pair into the model (`FrozenDEQ.with_solver`).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np

from deq_jax.neural_solver.initializer import LearnedInit, initializer_input
from deq_jax.neural_solver.state_shape import StateShape, is_multiscale
from deq_jax.nn.intercept import deq_call
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver

# The initialiser kind for each per-sample state rank: (D,), (L, C), (H, W, C).
INITIALIZER_FOR_RANK = {1: "vector", 2: "sequence", 3: "image"}


class Targets(NamedTuple):
    """One batch of neural-solver training data.

    Attributes:
      args: the cell's arguments ``(cell variables, x, dropout key)``.
      x: the injected input ``[B, ...]`` the initialiser reads (its ``"injection"``
        entry for a DEQ whose input is a mapping; `initializer_input`).
      z_star: the fixed points ``[B, *state_shape]`` (a tuple of them for a multiscale
        state).
      rel_residual: ``||f(z*) - z*|| / ||f(z*)||`` per sample ``[B]`` (host array).
    """

    args: Any
    x: jax.Array
    z_star: Any
    rel_residual: np.ndarray


class FrozenDEQ:
    """A task model's first DEQ with fixed variables (see the module docstring).

    Args:
      model: the linen task model (built from a config).
      variables: its trained variables (``state.variables()``).
      target_solver: the classic solver giving ``z*`` (its ``max_iter`` is the
        budget); Anderson with ``tol=1e-6``, 80 steps by default.
      extras: batch keys the model takes as keywords (the task's ``batch_extras``).
    """

    def __init__(
        self,
        model: nn.Module,
        variables: Any,
        *,
        target_solver: Solver | None = None,
        extras: Sequence[str] = (),
    ):
        self.model, self.variables, self.extras = model, variables, tuple(extras)
        self.target_solver = target_solver or anderson(tol=1e-6, max_iter=80)
        self._f: Callable[[Any, Any], Any] | None = None
        target_model = model.clone(deq=model.deq.replace(solver=self.target_solver, z_init="zeros"))

        def solve(variables, inputs, extras):
            call = deq_call(
                target_model, variables, inputs, max_iter=self.target_solver.max_iter, **extras
            )
            self._f = call.problem.f  # pure; the same function for every batch
            return call.problem.args, call.z_star, call.stats.rel_residual

        self._solve = jax.jit(solve)

    @property
    def f(self) -> Callable[[Any, Any], Any]:
        """The frozen cell ``f(z, args) -> z`` (available after the first `targets`)."""
        if self._f is None:
            raise ValueError("FrozenDEQ.f is known after the first call of targets().")
        return self._f

    def targets(self, batch: dict[str, Any]) -> Targets:
        """Solves ``batch["inputs"]`` to its fixed points with the target solver.

        Raises:
          ValueError: if the DEQ's state is not one array, or the injected input is not
            one array with the state's batch and spatial axes (what the initialisers
            and `deq_jax.neural_solver.neural_solver` need).
        """
        extras = {k: batch[k] for k in self.extras}
        args, z_star, rel = self._solve(self.variables, batch["inputs"], extras)
        x = initializer_input(args[1])
        multiscale = isinstance(z_star, tuple | list)
        arrays = all(isinstance(z, jax.Array) for z in (z_star if multiscale else [z_star]))
        if not arrays or not isinstance(x, jax.Array):
            raise ValueError(
                "A neural solver needs a DEQ whose state is one array or a tuple of arrays "
                "(one per resolution) and whose injected input is one array; this model's "
                f"are {jax.tree_util.tree_structure(z_star)} and "
                f"{jax.tree_util.tree_structure(x)}."
            )
        first = z_star[0] if multiscale else z_star  # the highest resolution
        if x.shape[:-1] != first.shape[:-1]:
            raise ValueError(
                f"The injected input {x.shape} and the state {first.shape} (its highest "
                "resolution) must share their batch and spatial axes (the initialiser "
                "maps one to the other)."
            )
        return Targets(args, x, tuple(z_star) if multiscale else z_star, np.asarray(rel))

    def with_solver(self, solver: Solver, z_init: Any = "keep") -> nn.Module:
        """The model with another forward solver (and, unless ``"keep"``, ``z_init``)."""
        spec = self.model.deq.replace(solver=solver)
        if z_init != "keep":
            spec = spec.replace(z_init=z_init)
        return self.model.clone(deq=spec)


def initializer_kind(state_shape: StateShape) -> str:
    """The initialiser kind for a per-sample state shape (vector, sequence, image, or
    multiscale for a tuple of image shapes).

    Raises:
      ValueError: for a state of another rank.
    """
    if is_multiscale(state_shape):
        if not all(len(shape) == 3 for shape in state_shape):
            raise ValueError(
                f"No initialiser for a multiscale state of shapes {tuple(state_shape)}; it "
                "covers tuples of image states (H, W, C)."
            )
        return "multiscale"
    if len(state_shape) not in INITIALIZER_FOR_RANK:
        raise ValueError(
            f"No initialiser for states of per-sample shape {tuple(state_shape)}; the kinds "
            "cover (D,), (L, C) and (H, W, C)."
        )
    return INITIALIZER_FOR_RANK[len(state_shape)]


def initializer_features(state_shape: StateShape) -> int | tuple[int, ...]:
    """The initialiser's ``features``: the channels, one per resolution for a
    multiscale state."""
    if is_multiscale(state_shape):
        return tuple(int(shape[-1]) for shape in state_shape)
    return int(state_shape[-1])


def learned_init(state_shape: StateShape, init_params: Any, **options: Any) -> LearnedInit:
    """The `LearnedInit` of trained initialiser variables for this state shape."""
    kind = initializer_kind(state_shape)
    features = initializer_features(state_shape)
    return LearnedInit(kind, features, init_params, tuple(options.items()))
