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

from deq_jax import _flat
from deq_jax.backward.base import Backward
from deq_jax.fixed_point import fixed_point
from deq_jax.nn.spec import DEQSpec
from deq_jax.nn.state import initial_state, state_like
from deq_jax.regularizers.terms import Resolve, Term, evaluate_terms
from deq_jax.solvers.base import Solver, SolverStats


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


_SHORTHANDS = ("solver", "backward", "z_init", "train_max_iter", "eval_max_iter", "terms")


class DEQ(nn.Module):
    """A deep equilibrium layer: returns ``z*`` with ``z* = cell(z*, x)``.

    The state. The cell may define ``state_spec(self, x)`` returning a pytree of
    `jax.ShapeDtypeStruct` (each with the batch axis first); `state_like` covers the
    common case ``[B, ..., features]``, and the cells of `deq_jax.nn.cells` define it.
    A cell without ``state_spec`` has a state shaped like ``x`` (an array then). An
    explicit ``z0`` argument overrides ``z_init`` and must match the spec if the cell
    declares one.

    Work done once per solve. A cell may define ``prepare(self, x) -> x'``: what does
    not depend on the state (e.g. the language model's memory keys and projected
    positions). The DEQ applies it once, with the solve's dropout key, and every
    iteration calls ``cell(z, x')``; ``x'`` is the ``x`` of `problem`'s ``args``, and
    gradients reach the variables through both. ``cell(z, x)`` on an unprepared ``x``
    must give the same result.

    Train and eval. ``train`` is a required keyword. In training, the DEQ draws one key
    from the ``"dropout"`` rng stream per call (if the caller supplied that stream) and
    hands the same key to every cell evaluation, so `VariationalDropout` keeps one mask
    for the whole solve; at eval no dropout rng reaches the cell. Stateful layers such
    as `SpectralNorm` update their ``"batch_stats"`` once per forward pass: when
    training with that collection mutable, the cell is called once at ``z0`` outside
    the solve; inside the solve every collection is read-only.

    Stability. The penalty terms of ``spec.terms`` (`deq_jax.regularizers.terms`: the
    Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` of Bai et al. 2021, a hinge on the
    spectral radius of ``J_f(z*)``, the fixed-point alignment penalty) are evaluated at
    ``z*`` and sown, each ``[B]``, into ``"intermediates"`` (call ``apply`` with
    ``mutable=["intermediates"]`` and the rng streams they draw from);
    `deq_jax.training` weighs them into the loss.

    Budgets. A call solves with ``spec.train_max_iter`` or ``spec.eval_max_iter``
    (whichever matches ``train``; ``None`` keeps the solver's ``max_iter``), or with the
    ``max_iter`` call argument above both (for sweeping the test-time budget). The
    spec decides it in one place (`DEQSpec.solver_for`): the solver of `problem`, with
    that budget, is the one the call runs.

    Attributes:
      cell: a linen module, ``cell(z, x) -> z``, deterministic given ``z``, ``x`` and
        the ``"dropout"`` key.
      spec: what the DEQ solves with (`DEQSpec`: solver, backward mode, ``z_init``,
        budgets); ``DEQSpec()`` (Anderson, IFT, zeros) by default.
      solver, backward, z_init, train_max_iter, eval_max_iter, terms: shorthands for the
        fields of ``spec`` of the same names: ``DEQ(cell, solver=s)`` is
        ``DEQ(cell, spec=DEQSpec(solver=s))``. A shorthand that is given replaces that
        field of ``spec``; after construction ``spec`` holds them all and the
        shorthands are ``None``.

    Example::

        spec = DEQSpec(solver=dj.solvers.anderson(tol=1e-4), train_max_iter=30)
        model = DEQ(MLPCell(features=32), spec=spec)
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
    spec: DEQSpec | None = None
    solver: Solver | None = None
    backward: Backward | None = None
    z_init: str | Callable[[Any], Any] | None = None
    train_max_iter: int | None = None
    eval_max_iter: int | None = None
    terms: tuple[Term, ...] | None = None

    def __post_init__(self):
        shorthands = {name: getattr(self, name) for name in _SHORTHANDS}
        given = {name: value for name, value in shorthands.items() if value is not None}
        spec = self.spec if self.spec is not None else DEQSpec()
        if not isinstance(spec, DEQSpec):
            raise TypeError(f"spec must be a deq_jax.nn.DEQSpec, got {spec!r}.")
        object.__setattr__(self, "spec", spec.replace(**given) if given else spec)
        for name in given:
            object.__setattr__(self, name, None)
        super().__post_init__()

    def solver_for(self, train: bool, max_iter: int | None = None) -> Solver:
        """The forward solver used for a call with these ``train`` and ``max_iter``."""
        return self.spec.solver_for(train, max_iter)

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

        The penalty terms of ``spec.terms`` (`deq_jax.regularizers.terms`) are evaluated
        at the fixed point and sown into ``"intermediates"`` under their names, each
        ``[B]`` (call ``apply`` with ``mutable=["intermediates"]`` and the rng streams
        they draw from: ``"jacobian"`` for the Jacobian estimates, ``"z0"`` for the
        alignment penalty's second start).

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
        f, z0, args, solver = self._problem(x, z0, train, max_iter)
        # the solver carries the call's budget; fixed_point checks the cell's output
        solve = lambda start, probe=None: fixed_point(
            f, start, args, solver=solver, backward=self.spec.backward_for(), stats_probe=probe
        )
        sol = solve(z0, stats_probe)
        if self.spec.terms:
            resolve = lambda start: solve(start).value
            sow_terms(self, self.spec.terms, f, sol.value, args, resolve)
        return sol.value, sol.stats

    def initial_state(self, x: Any, z0: Any) -> Any:
        """``z0`` checked against the cell's ``state_spec(x)``, or built from ``z_init``.

        Raises:
          ValueError: if ``z0`` does not match the spec, or ``z_init`` needs a ``"z0"``
            rng that was not supplied.
        """
        z_init = self.spec.z_init
        if z0 is None and callable(z_init):
            z0 = z_init(x)
        if z0 is None:
            key = None
            if z_init != "zeros":
                if not (self.has_rng("z0") or self.has_rng("params")):
                    raise ValueError(
                        f"z_init={z_init!r} draws the initial state from the 'z0' rng "
                        "stream: pass rngs={'z0': key} to apply, or give z0 explicitly."
                    )
                key = self.make_rng("z0")
            return initial_state(self.state_spec(x), z_init, key)
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
          reproduces the forward solve (the call solves exactly this problem: its
          solver carries the call's budget), and the analysis tools
          (`deq_jax.analysis`) can re-solve it from other starts. No variable is
          created or updated.

        Raises:
          ValueError: as `initial_state`. (The cell's output is checked against the
          state by `deq_jax.fixed_point` when the problem is solved.)
        """
        return self._problem(x, self.initial_state(x, z0), train, max_iter)

    def _problem(self, x: Any, z0: Any, train: bool, max_iter: int | None) -> EquilibriumProblem:
        """`problem` from an initial state already built (`initial_state`)."""
        solver = self.solver_for(train, max_iter)
        module, variables = self.cell.unbind()
        dropout_key = self.make_rng("dropout") if train and self.has_rng("dropout") else None
        if callable(getattr(module, "prepare", None)):
            # the cell's state-independent work, once per solve instead of per iteration
            rngs = None if dropout_key is None else {"dropout": dropout_key}
            x = module.apply(variables, x, rngs=rngs, method=type(module).prepare)

        def f(z, args):
            cell_vars, x_in, key = args
            rngs = None if key is None else {"dropout": key}
            cell = lambda z_c, v, x_c: module.apply(v, z_c, x_c, rngs=rngs)
            # spec.precision: the cell's arithmetic; the solver's state stays float32
            return self.spec.constrain_state(self.spec.in_precision(cell, z, cell_vars, x_in))

        z0 = self.spec.constrain_state(z0)  # spec.state_sharding: rows like the activations
        return EquilibriumProblem(f, z0, (variables, x, dropout_key), solver)


def sow_terms(
    module: nn.Module, terms: tuple[Term, ...], f, z_star: Any, args: Any, resolve: Resolve
) -> None:
    """Sows into ``module``'s ``"intermediates"`` the values of ``terms`` at ``z_star``
    (each ``[B]``, under its name; `deq_jax.regularizers.evaluate_terms`), drawing each
    term's key from ``module``'s rng stream. Shared by `DEQ` and the CLRS model's
    unrolled mode.

    Raises:
      ValueError: if a term's rng stream was not supplied.
    """

    def key(stream: str) -> jax.Array:
        if not (module.has_rng(stream) or module.has_rng("params")):
            users = ", ".join(type(t).__name__ for t in terms if t.stream == stream)
            raise ValueError(
                f"{users} draw(s) from the {stream!r} rng stream: pass "
                f"rngs={{{stream!r}: key}} to apply."
            )
        return module.make_rng(stream)

    for name, value in evaluate_terms(terms, f, z_star, args, key, resolve).items():
        module.sow("intermediates", name, value)


def spec_of(model: nn.Module) -> DEQSpec | None:
    """The `DEQSpec` a model solves with: a `DEQ`'s ``spec`` or a task model's ``deq``
    field; ``None`` for a model with neither (e.g. a wrapper of another model)."""
    if isinstance(model, DEQ):
        return model.spec
    spec = getattr(model, "deq", None)
    return spec if isinstance(spec, DEQSpec) else None


def with_spec(model: nn.Module, **changes: Any) -> nn.Module:
    """``model`` with its DEQ's spec changed (`DEQSpec.replace`): a `DEQ` (its ``spec``)
    or a task model (its ``deq`` field); a model with neither is returned unchanged
    (e.g. ``with_spec(model, state_sharding=...)``, how the train step places the
    solve's state on the run's mesh).
    """
    spec = spec_of(model)
    if spec is None or not changes:
        return model
    spec = spec.replace(**changes)
    return model.clone(spec=spec) if isinstance(model, DEQ) else model.clone(deq=spec)


def with_terms(model: nn.Module, terms: tuple[Term, ...]) -> nn.Module:
    """``model`` with ``terms`` appended to its DEQ's spec: a `DEQ` (its ``spec``) or a
    task model (its ``deq`` field). How the train step hands its penalties to a model.

    Raises:
      TypeError: for a model with neither.
    """
    terms = tuple(terms)
    if not terms:
        return model
    spec = spec_of(model)
    if spec is None:
        raise TypeError(
            f"{type(model).__name__} has no DEQSpec field 'deq' to hand penalty terms to."
        )
    spec = spec.replace(terms=spec.terms + terms)
    return model.clone(spec=spec) if isinstance(model, DEQ) else model.clone(deq=spec)
