"""`DEQSpec`: what a DEQ solves with, in one frozen, hashable object.

The forward solver (with its tolerance), the backward mode, the initial state and the
iteration budgets of training and evaluation travel together: one field of the `DEQ`
layer and of every task model (``deq``), built from one ``config.deq`` section
(`deq_jax.training.run.build.build_deq_spec`). A budget is applied where a solve is called
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

from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.precision import check_precision, in_precision
from deq_jax.regularizers.terms import Term, check_terms
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver
from deq_jax.solvers.floor import Floor, floor_of

Z_INITS = ("zeros", "normal", "mixed")


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
      precision: the arithmetic of the cell's matmuls and convolutions during the
        solve (`deq_jax.precision`): ``"default"`` (the backend's: float32 on the CPU,
        TensorFloat-32 on NVIDIA GPUs, one bfloat16 pass on TPUs), ``"float32"`` (true
        float32 everywhere) or ``"bfloat16"`` (bfloat16 operands, float32
        accumulation; norms, softmax and the rest in float32). The solver's state,
        its history, the residuals, the parameters and the whole backward solve stay
        float32. Where the arithmetic is coarser than float32 (bfloat16; "default" on
        a GPU or TPU) every solve measures its residual floor and stops each sample at
        ``max(tol, floor)`` instead of running its budget below it
        (`deq_jax.solvers.floor`; the stats' ``floor`` and ``at_floor``), and so does
        the IFT backward solve. Only the DEQ solve is affected (a model's explicit
        weight-tied or unrolled modes call the cell directly). Accuracy and iterations
        per precision: ``docs/solvers_and_gradients.md``.
      floor_margin: a sample stops at ``max(tol, floor_margin * floor)``
        (`deq_jax.solvers.floor.Floor`); below 1 trades iterations for accuracy.
      state_sharding: where the state's arrays lie on a device mesh, a
        `jax.sharding.Sharding` for arrays with the batch axis first (e.g.
        ``NamedSharding(mesh, P(("data", "fsdp")))``: each device a slice of the rows,
        like the activations). It constrains the initial state and every output of the
        cell (`constrain_state`), so the solver's state and history, built from those,
        and the backward solve's state (the cotangent of the constrained output) lie the
        same way, and a device iterates on its own rows only. ``None``: the compiler
        chooses. `deq_jax.training` sets it from the run's mesh.

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
    precision: str = "default"
    floor_margin: float = 1.0
    state_sharding: Any = None

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
        check_precision(self.precision)
        if not self.floor_margin > 0:
            raise ValueError(f"floor_margin must be positive, got {self.floor_margin!r}.")

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

    def floor(self) -> Floor | None:
        """The residual floor rule of this spec's precision on JAX's default backend
        (`deq_jax.solvers.floor`); ``None`` where the cell's matmuls are true float32."""
        floor = floor_of(self.precision)
        return None if floor is None else dataclasses.replace(floor, margin=self.floor_margin)

    def solver_for(self, train: bool, max_iter: int | None = None) -> Solver:
        """The forward solver with the budget of a call with these arguments, and the
        floor rule of the precision (unless the solver has one of its own)."""
        solver = self.solver.replace(max_iter=self.budget(train, max_iter))
        floor = self.floor()
        return solver if floor is None or solver.floor is not None else solver.replace(floor=floor)

    def backward_for(self) -> Backward:
        """The backward mode, its backward solve stopping at the precision's floor."""
        return self.backward.with_floor(self.floor())

    def in_precision(self, fn: Callable[..., Any], z: Any, *operands: Any) -> Any:
        """``fn(z, *operands)`` computed in this spec's ``precision``
        (`deq_jax.precision.in_precision`): the cell of a DEQ's solve."""
        return in_precision(fn, self.precision)(z, *operands)

    def constrain_state(self, z: Any) -> Any:
        """``z`` (a state: every array with the batch axis first) constrained to
        ``state_sharding`` (`jax.lax.with_sharding_constraint`); unchanged without one."""
        if self.state_sharding is None:
            return z
        return jax.tree_util.tree_map(
            lambda a: jax.lax.with_sharding_constraint(a, self.state_sharding), z
        )
