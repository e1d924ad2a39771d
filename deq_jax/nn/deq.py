"""`DEQ`: a Flax module whose output is the fixed point of a cell.

The cell is any linen module called as ``cell(z, x) -> z``; input injection is the
cell's business. The DEQ layer owns everything about the solve: the initial state,
the solver and its train/eval iteration budgets, the backward mode, the rngs handed to
the cell and the returned statistics.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax import _flat
from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.fixed_point import fixed_point
from deq_jax.regularizers.jacobian import (
    jacobian_frobenius,
    spectral_radius,
    spectral_radius_penalty_estimate,
)
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver, SolverStats

Z_INITS = ("zeros", "normal", "mixed")


def float_dtype(dtype: Any) -> Any:
    """``dtype`` if it is a float dtype, else the default float dtype (for int inputs)."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.dtype(dtype)
    return jnp.dtype(jnp.result_type(float))


def state_like(x: jax.Array, features: int | None = None, dtype: Any = None) -> Any:
    """The spec of a state shaped like ``x`` with ``features`` channels on the last axis.

    Args:
      x: the input, ``[B, ..., C]``.
      features: the state's channels; ``None`` keeps ``C``.
      dtype: the state's dtype; ``None`` takes ``x``'s float dtype.

    Returns:
      A `jax.ShapeDtypeStruct` ``[B, ..., features]``, what a cell's ``state_spec``
      returns in the common case.
    """
    shape = x.shape if features is None else (*x.shape[:-1], features)
    return jax.ShapeDtypeStruct(shape, float_dtype(x.dtype) if dtype is None else dtype)


def _mixed_mask(key: jax.Array, batch: int) -> jax.Array:
    """``[B]`` bool, true for the samples that start from a Gaussian, false for zeros.

    Exactly ``B // 2`` samples start at zero (plus one more with probability 1/2 when
    ``B`` is odd), chosen at random, so each sample is zero with probability 1/2.
    """
    k_perm, k_coin = jax.random.split(key)
    n_zero = batch // 2 + (batch % 2) * jax.random.bernoulli(k_coin).astype(jnp.int32)
    return jax.random.permutation(k_perm, batch) >= n_zero


def initial_state(spec: Any, z_init: str, key: jax.Array | None) -> Any:
    """Builds an initial state for the spec (a pytree of shapes and dtypes).

    Args:
      spec: a pytree of `jax.ShapeDtypeStruct` (or arrays), each ``[B, ...]``.
      z_init: ``"zeros"``, ``"normal"`` (standard Gaussian) or ``"mixed"`` (each sample
        zeros or Gaussian with probability 1/2, exactly half the batch zeros).
      key: the rng key for ``"normal"`` and ``"mixed"``.

    Returns:
      A pytree of arrays like ``spec``.

    References:
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022 (the mixed initialisation).
    """
    if z_init not in Z_INITS:
        raise ValueError(f"z_init must be one of {', '.join(Z_INITS)}, got {z_init!r}.")
    leaves, treedef = jax.tree_util.tree_flatten(spec)
    if z_init == "zeros":
        return jax.tree_util.tree_unflatten(treedef, [jnp.zeros(s.shape, s.dtype) for s in leaves])
    k_mask, *keys = jax.random.split(key, len(leaves) + 1)
    noise = [jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves, strict=True)]
    if z_init == "mixed":
        batch = leaves[0].shape[0]
        keep = _mixed_mask(k_mask, batch)  # [B]
        noise = [jnp.where(keep.reshape((batch,) + (1,) * (z.ndim - 1)), z, 0) for z in noise]
    return jax.tree_util.tree_unflatten(treedef, noise)


class EquilibriumProblem(NamedTuple):
    """A DEQ's forward problem as pure pieces (see `DEQ.problem`).

    Attributes:
      f: the cell as a pure function, ``f(z, args) -> z``, batched along axis 0.
      z0: the initial state.
      args: ``f``'s arguments: the cell's variables, the injected input, the dropout key.
      solver: the forward solver with the call's budget.
    """

    f: Callable[[Any, Any], Any]
    z0: Any
    args: Any
    solver: Solver


def _check_cell_output(f, z0: Any, args: Any) -> None:
    out = jax.eval_shape(f, z0, args)
    if not _flat.same_specs(out, z0):
        raise ValueError(
            "cell(z, x) must return a state with the structure, shapes and dtypes of z; z is "
            f"{_flat.describe(z0)} but cell(z, x) is {_flat.describe(out)}. Give the cell a "
            "state_spec(x) method (see deq_jax.nn.state_like) or pass z0 explicitly."
        )


class DEQ(nn.Module):
    """A deep equilibrium layer: returns ``z*`` with ``z* = cell(z*, x)``.

    The state. The cell may define ``state_spec(self, x)`` returning a pytree of
    `jax.ShapeDtypeStruct` (each with the batch axis first); `state_like` covers the
    common case ``[B, ..., features]``, and the cells of `deq_jax.nn.cells` define it.
    A cell without ``state_spec`` has a state shaped like ``x`` (an array then). An
    explicit ``z0`` argument overrides ``z_init`` and must match the spec if the cell
    declares one.

    Train and eval. ``train`` is a required keyword. In training, the DEQ draws one key
    from the ``"dropout"`` rng stream per call (if the caller supplied that stream) and
    hands the same key to every cell evaluation, so `VariationalDropout` keeps one mask
    for the whole solve; at eval no dropout rng reaches the cell. Stateful layers such
    as `SpectralNorm` update their ``"batch_stats"`` once per forward pass: when
    training with that collection mutable, the cell is called once at ``z0`` outside
    the solve; inside the solve every collection is read-only.

    Stability. With ``jacobian_samples > 0`` the call sows the Hutchinson estimate of
    ``||J_f(z*)||_F^2 / d`` (the regulariser of Bai et al. 2021) and with
    ``spectral_iters > 0`` the power-method spectral radius of ``J_f(z*)``, each ``[B]``,
    into ``"intermediates"`` (call ``apply`` with ``mutable=["intermediates"]`` and a
    ``"jacobian"`` rng); `deq_jax.training` adds the first to the loss.

    Budgets. The solver's ``max_iter`` is replaced by ``train_max_iter`` or
    ``eval_max_iter`` (whichever matches ``train``, if set), and by the ``max_iter``
    call argument above both (for sweeping the test-time budget).

    Attributes:
      cell: a linen module, ``cell(z, x) -> z``, deterministic given ``z``, ``x`` and
        the ``"dropout"`` key.
      solver: the forward solver (a `deq_jax.solvers` object), ``anderson()`` by default.
      backward: the backward mode (a `deq_jax.backward` object), ``ift()`` by default.
      z_init: the initial state when no ``z0`` is given: ``"zeros"``, ``"normal"`` or
        ``"mixed"`` (see `initial_state`); the last two draw from the ``"z0"`` rng
        stream. Or a hashable callable ``z_init(x) -> z0`` of the injected input, such
        as a trained `deq_jax.neural_solver.LearnedInit`. (Named ``z_init`` because
        ``init`` is `flax.linen.Module.init`.)
      train_max_iter: the solver budget when ``train=True``; ``None`` keeps the solver's.
      eval_max_iter: the solver budget when ``train=False``; ``None`` keeps the solver's.

    Example::

        model = DEQ(MLPCell(features=32), solver=dj.solvers.anderson(tol=1e-4))
        variables = model.init(key, x, train=False)
        (z_star, stats), _ = model.apply(variables, x, train=True,
                                         rngs={"dropout": k1}, mutable=["batch_stats"])

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021.
    """

    cell: nn.Module
    solver: Solver = anderson()
    backward: Backward = ift()
    z_init: str | Callable[[Any], Any] = "zeros"
    train_max_iter: int | None = None
    eval_max_iter: int | None = None

    def __post_init__(self):
        if not isinstance(self.solver, Solver):
            raise TypeError(f"solver must be a deq_jax Solver, got {self.solver!r}.")
        if not isinstance(self.backward, Backward):
            raise TypeError(f"backward must be a deq_jax backward mode, got {self.backward!r}.")
        if not callable(self.z_init) and self.z_init not in Z_INITS:
            raise ValueError(
                f"z_init must be one of {', '.join(Z_INITS)} or a callable x -> z0, got "
                f"{self.z_init!r}."
            )
        for name in ("train_max_iter", "eval_max_iter"):
            budget = getattr(self, name)
            if budget is not None and (not isinstance(budget, int) or budget < 1):
                raise ValueError(f"{name} must be None or an integer >= 1, got {budget!r}.")
        super().__post_init__()

    def solver_for(self, train: bool, max_iter: int | None = None) -> Solver:
        """The forward solver used for a call with these ``train`` and ``max_iter``."""
        budget = max_iter
        if budget is None:
            budget = self.train_max_iter if train else self.eval_max_iter
        return self.solver if budget is None else self.solver.replace(max_iter=budget)

    def state_spec(self, x: jax.Array) -> Any:
        """The state's spec for input ``x``: the cell's ``state_spec(x)``, else like ``x``."""
        spec_fn = getattr(self.cell, "state_spec", None)
        return spec_fn(x) if callable(spec_fn) else state_like(x)

    @nn.compact
    def __call__(
        self,
        x: Any,
        z0: Any = None,
        *,
        train: bool,
        max_iter: int | None = None,
        stats_probe: jax.Array | None = None,
        jacobian_samples: int = 0,
        spectral_iters: int = 0,
        spectral_penalty_iters: int = 0,
        alignment: bool = False,
    ) -> tuple[Any, SolverStats]:
        """Solves ``z = cell(z, x)``.

        Args:
          x: the input injected into the cell at every iteration (any pytree the cell
            takes), batched along axis 0.
          z0: an explicit initial state; ``None`` builds one from ``z_init``.
          train: training mode (dropout rng, stats updates, ``train_max_iter``).
          max_iter: overrides the budget for this call (a Python int, static under
            `jax.jit`). An ``ift()`` without its own solver reuses this budget backward.
          stats_probe: an optional `deq_jax.backward.stats_probe()` whose gradient
            carries the backward solve's statistics (see `deq_jax.backward.probe`).
          jacobian_samples: if ``> 0``, sows the Hutchinson estimate of
            ``||J_f(z*)||_F^2 / d`` with this many probes as ``"jacobian_term"`` ``[B]``
            in the ``"intermediates"`` collection (`deq_jax.regularizers.jacobian_frobenius`
            at the detached ``z*``, differentiable w.r.t. the cell's parameters). Draws
            from the ``"jacobian"`` rng stream.
          spectral_iters: if ``> 0``, sows the power-method estimate of ``rho(J_f(z*))``
            with this many iterations as ``"spectral_radius"`` ``[B]`` (a diagnostic, at
            the detached ``z*``). Draws from the ``"jacobian"`` rng stream.
          spectral_penalty_iters: if ``> 0``, sows
            `deq_jax.regularizers.spectral_radius_penalty_estimate` with this many
            detached power steps as ``"spectral_estimate"`` ``[B]``, differentiable w.r.t.
            the cell's parameters (the regulariser's ``spectral_weight`` penalises it).
            Draws from the ``"jacobian"`` rng stream.
          alignment: if true, solves again from a fresh standard Gaussian start (drawn
            from the ``"z0"`` stream, with the same solver and backward mode) and sows
            ``1 - cos(z*, z*')`` per sample as ``"alignment_term"`` ``[B]``,
            differentiable through both solves: the fixed-point alignment penalty of
            Anil et al. (2022), see `deq_jax.training.interventions`.

        Returns:
          ``(z_star, stats)``: the fixed point (like the state, differentiable w.r.t. the
          cell's parameters and ``x`` through the backward mode) and the solver's
          per-sample `deq_jax.SolverStats`.

        Raises:
          ValueError: if the cell's output does not match the state, an explicit ``z0``
            does not match the cell's ``state_spec``, or ``z_init`` needs a ``"z0"`` rng
            (or the Jacobian estimates a ``"jacobian"`` rng) that was not supplied.

        References:
          Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
          Regularization", ICML 2021 (the Jacobian term and the spectral radius).
        """
        z0 = self.initial_state(x, z0)
        if self.is_initializing() or (train and self.is_mutable_collection("batch_stats")):
            self.cell(z0, x)  # creates the variables / updates stats once per forward
        problem = self.problem(x, z0, train=train, max_iter=max_iter)
        f, args, solver = problem.f, problem.args, problem.solver
        sol = fixed_point(
            f, problem.z0, args, solver=solver, backward=self.backward, stats_probe=stats_probe
        )
        if jacobian_samples > 0 or spectral_iters > 0 or spectral_penalty_iters > 0:
            self._sow_jacobian(
                f, sol.value, args, jacobian_samples, spectral_iters, spectral_penalty_iters
            )
        if alignment:
            self._sow_alignment(f, sol.value, args, solver)
        return sol.value, sol.stats

    def initial_state(self, x: Any, z0: Any) -> Any:
        """``z0`` checked against the cell's ``state_spec(x)``, or built from ``z_init``.

        Raises:
          ValueError: if ``z0`` does not match the spec, or ``z_init`` needs a ``"z0"``
            rng that was not supplied.
        """
        if z0 is None and callable(self.z_init):
            z0 = self.z_init(x)
        if z0 is None:
            key = None
            if self.z_init != "zeros":
                if not (self.has_rng("z0") or self.has_rng("params")):
                    raise ValueError(
                        f"z_init={self.z_init!r} draws the initial state from the 'z0' rng "
                        "stream: pass rngs={'z0': key} to apply, or give z0 explicitly."
                    )
                key = self.make_rng("z0")
            return initial_state(self.state_spec(x), self.z_init, key)
        if callable(getattr(self.cell, "state_spec", None)):
            spec = self.cell.state_spec(x)
            if not _flat.same_specs(z0, spec):
                raise ValueError(
                    f"z0 must match the cell's state_spec(x), {_flat.describe(spec)}; "
                    f"got {_flat.describe(z0)}."
                )
        return z0

    def problem(
        self, x: Any, z0: Any = None, *, train: bool, max_iter: int | None = None
    ) -> EquilibriumProblem:
        """The fixed-point problem a call with these arguments solves, as pure pieces.

        Returns:
          An `EquilibriumProblem` ``(f, z0, args, solver)``: ``f(z, args) -> z`` is a
          pure function (the cell applied to its variables, ``args = (cell variables,
          x, dropout key)``), so ``deq_jax.fixed_point(f, z0, args, solver=solver)``
          reproduces the forward solve, and the analysis tools (`deq_jax.analysis`)
          can re-solve it from other starts. No variable is created or updated.
        """
        solver = self.solver_for(train, max_iter)
        z0 = self.initial_state(x, z0)
        module, variables = self.cell.unbind()
        dropout_key = self.make_rng("dropout") if train and self.has_rng("dropout") else None

        def f(z, args):
            cell_vars, x_in, key = args
            rngs = None if key is None else {"dropout": key}
            return module.apply(cell_vars, z, x_in, rngs=rngs)

        args = (variables, x, dropout_key)
        _check_cell_output(f, z0, args)
        return EquilibriumProblem(f, z0, args, solver)

    def _sow_alignment(self, f, z_star, args, solver: Solver) -> None:
        """Sows ``1 - cos`` between ``z*`` and the fixed point from a Gaussian start."""
        if not (self.has_rng("z0") or self.has_rng("params")):
            raise ValueError(
                "The alignment penalty draws its second start from the 'z0' rng stream: "
                "pass rngs={'z0': key} to apply."
            )
        start = initial_state(z_star, "normal", self.make_rng("z0"))  # shaped like z*
        other = fixed_point(f, start, args, solver=solver, backward=self.backward).value
        self.sow("intermediates", "alignment_term", 1.0 - _flat.per_sample_cosine(z_star, other))

    def _sow_jacobian(
        self,
        f,
        z_star,
        args,
        jacobian_samples: int,
        spectral_iters: int,
        spectral_penalty_iters: int = 0,
    ) -> None:
        """Sows the Jacobian term and the spectral radius estimates at the detached ``z*``."""
        if not (self.has_rng("jacobian") or self.has_rng("params")):
            raise ValueError(
                "The Jacobian estimates draw probes from the 'jacobian' rng stream: pass "
                "rngs={'jacobian': key} to apply."
            )
        sow_jacobian_terms(
            self,
            f,
            z_star,
            args,
            self.make_rng("jacobian"),
            jacobian_samples,
            spectral_iters,
            spectral_penalty_iters,
        )


def sow_jacobian_terms(
    module: nn.Module,
    f,
    z_star: Any,
    args: Any,
    key: jax.Array,
    jacobian_samples: int,
    spectral_iters: int,
    spectral_penalty_iters: int = 0,
) -> None:
    """Sows into ``module``'s ``"intermediates"`` the estimates of ``J_f`` at the detached
    ``z_star`` that the call asks for (each ``[B]``, none for a zero count):
    ``"jacobian_term"`` (`jacobian_frobenius`, ``jacobian_samples`` probes),
    ``"spectral_radius"`` (`spectral_radius`, ``spectral_iters`` steps, detached) and
    ``"spectral_estimate"`` (`spectral_radius_penalty_estimate`,
    ``spectral_penalty_iters`` detached power steps, differentiable w.r.t. ``args``).
    Shared by `DEQ` and the CLRS model's unrolled mode.
    """
    k_term, k_rho = jax.random.split(key)
    z_star = jax.lax.stop_gradient(z_star)
    if jacobian_samples > 0:
        term = jacobian_frobenius(f, z_star, args, k_term, jacobian_samples)  # [B]
        module.sow("intermediates", "jacobian_term", term)
    if spectral_iters > 0:
        rho = spectral_radius(f, z_star, args, k_rho, spectral_iters)  # [B]
        module.sow("intermediates", "spectral_radius", jax.lax.stop_gradient(rho))
    if spectral_penalty_iters > 0:
        k_pen = jax.random.fold_in(key, 2)
        rho = spectral_radius_penalty_estimate(f, z_star, args, k_pen, spectral_penalty_iters)
        module.sow("intermediates", "spectral_estimate", rho)  # [B]


def solve_cell(
    owner: nn.Module,
    cell: nn.Module,
    x: Any,
    train: bool,
    max_iter: int | None,
    deq_options: dict[str, Any],
) -> tuple[Any, SolverStats]:
    """Solves ``cell`` with a `DEQ` named ``"deq"`` configured from ``owner``'s fields.

    The shared step of the task models (`deq_jax.nn.models`): ``owner`` carries
    ``solver``, ``backward``, ``z_init``, ``train_max_iter`` and ``eval_max_iter``;
    ``deq_options`` (``z0``, ``stats_probe``, ``jacobian_samples``, ``spectral_iters``,
    ``spectral_penalty_iters``, ``alignment``) go to the `DEQ` call unchanged. Call it
    from ``owner``'s compact method.
    """
    deq = DEQ(
        cell,
        solver=owner.solver,
        backward=owner.backward,
        z_init=owner.z_init,
        train_max_iter=owner.train_max_iter,
        eval_max_iter=owner.eval_max_iter,
        name="deq",
    )
    return deq(x, train=train, max_iter=max_iter, **deq_options)
