"""`DEQSpec`: what a DEQ solves with, in one frozen, hashable object.

The forward solver (with its tolerance), the backward mode, the initial state and the
iteration budgets of training and evaluation travel together: one field of the `DEQ`
layer and of every task model (``deq``), built from one ``config.deq`` section
(`deq_jax.training.build.build_deq_spec`). A budget is applied where a solve is called
(`deq_jax.fixed_point`'s ``max_iter``), so one solver serves training, evaluation and
analysis with different budgets.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (the initial states).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.regularizers.terms import Term, check_terms
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver

Z_INITS = ("zeros", "normal", "mixed")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class DEQSpec:
    """The solve of a DEQ: solver, backward mode, initial state and budgets.

    Attributes:
      solver: the forward solver (a `deq_jax.solvers` object); its ``tol`` and
        ``stop_mode`` decide when a sample stops, its ``max_iter`` is the budget when
        neither the call nor this spec gives one.
      backward: the backward mode (a `deq_jax.backward` object). An ``ift()`` without
        its own solver solves the backward system with the forward solver at the
        call's budget.
      z_init: the initial state when no ``z0`` is given: ``"zeros"``, ``"normal"`` or
        ``"mixed"`` (see `deq_jax.nn.initial_state`; the last two draw from the
        ``"z0"`` rng stream), or a hashable callable ``z_init(x) -> z0`` of the injected
        input, such as a trained `deq_jax.neural_solver.LearnedInit`.
      train_max_iter: the budget (f-evaluations) of a solve with ``train=True``;
        ``None`` keeps the solver's ``max_iter``.
      eval_max_iter: the budget of a solve with ``train=False``; ``None`` keeps the
        solver's ``max_iter``.
      terms: penalty terms evaluated at the fixed point of every call
        (`deq_jax.regularizers.terms`: `JacobianTerm`, `SpectralHinge`, `Alignment`,
        `SpectralRadius`), each sowing per-sample values that the train step weighs.
        Usually empty in a model's config: the train step adds the terms of
        ``config.regularizer`` and ``config.path_independence``.
      compute_dtype: the dtype the cell computes in during the solve (mixed precision,
        issue 70): ``None`` (the default) computes in the state's own dtype, as
        without the option; ``"bfloat16"`` casts the state, the injected input and the
        cell's variables (their floating leaves; integer, bool and key leaves are left
        alone) to bfloat16 in each evaluation of ``f`` and casts the cell's output back
        to the state's dtype (`in_compute_dtype`). The solver's state, its
        Anderson/Broyden history, the residuals and the stopping test stay float32; the
        backward mode's VJPs run through the same ``f``, so they compute in bfloat16
        and accumulate in float32; the parameters stay float32 (master weights) and so
        do their gradients. ``"float32"`` casts to float32. Only the DEQ solve is
        affected (a model's explicit weight-tied or unrolled modes call the cell
        directly), and a layer that fixes its own computation dtype (e.g.
        ``nn.Dense(dtype=jnp.float32)``) keeps it. Meant for accelerators with fast
        bfloat16 matrix units (TPUs, recent GPUs): on a 2-core CPU a train step was
        1.2x slower. Accuracy: one bfloat16 evaluation of ``f`` is off by about 2e-3
        (relative), and the fixed point by up to that times ``1 / (1 - rho(J_f))``; the
        bfloat16 solve stalls at a relative residual of 1e-4 to 3e-3, so a tolerance
        below that runs the whole budget. The measured errors of the fixed point,
        loss and gradients on a tanh cell, the language model and the MDEQ:
        ``docs/results/mixed_precision.md``.

    Example::

        spec = DEQSpec(solver=dj.solvers.anderson(tol=1e-4), z_init="mixed",
                       train_max_iter=30, eval_max_iter=60)
        model = PrefixSumDEQ(width=32, deq=spec)
        model.clone(deq=spec.replace(solver=learned_solver))
    """

    solver: Solver = anderson()
    backward: Backward = ift()
    z_init: str | Callable[[Any], Any] = "zeros"
    train_max_iter: int | None = None
    eval_max_iter: int | None = None
    terms: tuple[Term, ...] = ()
    compute_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "terms", check_terms(self.terms))
        if not isinstance(self.solver, Solver):
            raise TypeError(f"solver must be a deq_jax Solver, got {self.solver!r}.")
        if not isinstance(self.backward, Backward):
            raise TypeError(f"backward must be a deq_jax backward mode, got {self.backward!r}.")
        self.backward.check_solver(self.solver)
        if not callable(self.z_init) and self.z_init not in Z_INITS:
            raise ValueError(
                f"z_init must be one of {', '.join(Z_INITS)} or a callable x -> z0, got "
                f"{self.z_init!r}."
            )
        for name in ("train_max_iter", "eval_max_iter"):
            budget = getattr(self, name)
            if budget is not None and (not isinstance(budget, int) or budget < 1):
                raise ValueError(f"{name} must be None or an integer >= 1, got {budget!r}.")
        if self.compute_dtype is not None and self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"compute_dtype must be None or one of {', '.join(COMPUTE_DTYPES)}, got "
                f"{self.compute_dtype!r}."
            )

    def replace(self, **changes: Any) -> DEQSpec:
        """A copy with some fields changed, e.g. ``spec.replace(solver=s, z_init=init)``."""
        return dataclasses.replace(self, **changes)

    def budget(self, train: bool, max_iter: int | None = None) -> int:
        """The f-evaluation budget of a solve: ``max_iter`` if given, else the train or
        eval budget, else the solver's ``max_iter``."""
        if max_iter is not None:
            return max_iter
        budget = self.train_max_iter if train else self.eval_max_iter
        return self.solver.max_iter if budget is None else budget

    def solver_for(self, train: bool, max_iter: int | None = None) -> Solver:
        """The forward solver with the budget of a call with these arguments."""
        return self.solver.replace(max_iter=self.budget(train, max_iter))

    def in_compute_dtype(self, fn: Callable[..., Any], z: Any, *operands: Any) -> Any:
        """``fn(z, *operands)`` computed in ``compute_dtype`` (see the class docstring).

        With ``compute_dtype=None`` this is ``fn(z, *operands)``. Otherwise the floating
        leaves of ``z`` and ``operands`` are cast to ``compute_dtype`` (other leaves
        pass unchanged) and the output's leaves are cast back to the dtypes of ``z``'s
        (an output whose structure differs from ``z``'s is returned as it is, for
        `deq_jax.fixed_point` to report). Differentiable: the VJP casts the cotangents
        the same way, so gradients reach ``z`` and ``operands`` in their own dtypes.
        """
        if self.compute_dtype is None:
            return fn(z, *operands)
        dtype = jnp.dtype(self.compute_dtype)
        out = fn(*(_cast_floating(tree, dtype) for tree in (z, *operands)))
        if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(z):
            return out
        return jax.tree_util.tree_map(lambda o, s: o.astype(jnp.result_type(s)), out, z)


def _cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating leaves cast to ``dtype``; other leaves unchanged."""

    def cast(leaf):
        floating = isinstance(leaf, jax.Array | np.ndarray) and jnp.issubdtype(
            leaf.dtype, jnp.floating
        )
        return jnp.asarray(leaf).astype(dtype) if floating else leaf

    return jax.tree_util.tree_map(cast, tree)
