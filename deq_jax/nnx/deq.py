"""`DEQ`: the deep equilibrium layer for Flax NNX, equal to `deq_jax.nn.DEQ`.

The cell is any ``nnx.Module`` called as ``cell(z, x) -> z``. The layer solves with one
`deq_jax.nn.DEQSpec` (the linen layer's class: solver, backward mode, initial state,
budgets, penalty terms), through the same `deq_jax.fixed_point`: ``nnx.split`` turns
the cell into a graph definition and a state, and the solver sees the pure function
``f(z, (state, x, dropout_key))`` that merges them, exactly the linen layer's
``f(z, (variables, x, dropout_key))``.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from deq_jax import _flat
from deq_jax.backward.base import Backward
from deq_jax.fixed_point import fixed_point
from deq_jax.nn.deq import EquilibriumProblem
from deq_jax.nn.spec import DEQSpec
from deq_jax.nn.state import initial_state, state_like
from deq_jax.nnx.dropout import hand_keys
from deq_jax.regularizers.terms import Term, evaluate_terms
from deq_jax.solvers.base import Solver, SolverStats


class DEQ(nnx.Module):
    """A deep equilibrium layer for NNX: returns ``z*`` with ``z* = cell(z*, x)``.

    It behaves as `deq_jax.nn.DEQ` (read its docstring for the state, ``state_spec``
    and ``prepare``); what differs is where NNX keeps things:

    * Train and eval. A call solves with the training budget and draws dropout keys
      when ``train`` is true; ``train=None`` (the default) follows the module's mode:
      ``model.train()`` (the initial mode) or ``model.eval()``, which set the
      ``deterministic`` attribute as for ``nnx.Dropout``.
    * Random numbers come from the ``rngs`` given at construction (a fork of them):
      the ``"dropout"`` stream gives one key per training solve, handed to every
      evaluation of the cell (`deq_jax.nnx.VariationalDropout` keeps one mask per
      solve; without that stream or a default one there is no dropout), ``"z0"`` the
      ``"normal"`` and ``"mixed"`` initial states and the alignment penalty's second
      start, ``"jacobian"`` the Jacobian estimates. ``nnx.Rngs(0)`` serves all three
      from its default stream.
    * Batch statistics (``nnx.BatchStat`` variables, e.g. `deq_jax.nnx.SpectralNorm`'s
      ``u``) advance once per training call: the cell is evaluated once at ``z0``,
      outside the solve, and its statistics written back; every evaluation inside the
      solve works on a copy of the cell's state, so the map being solved is the same
      at every iteration and nothing the solve does is written back.
    * Penalty terms (``spec.terms``) are evaluated at ``z*`` as the linen layer does
      and sown (``Module.sow``) as ``nnx.Intermediate`` values named as the linen
      layer's, each a tuple with one ``[B]`` array per call. Collect them with
      ``nnx.capture``: ``(z, stats), inter = nnx.capture(model, nnx.Intermediate)(x)``
      gives ``inter["jacobian_term"]`` (under the DEQ's path in a larger model, e.g.
      ``inter["deq"]["jacobian_term"]``), inside ``nnx.jit`` and ``nnx.grad`` too.

    Args:
      cell: an ``nnx.Module``, ``cell(z, x) -> z`` (same structure, shapes and dtypes
        as ``z``), deterministic given ``z``, ``x`` and the handed dropout keys.
      spec: what the DEQ solves with (`deq_jax.nn.DEQSpec`); ``DEQSpec()`` (Anderson,
        IFT, zeros) by default.
      rngs: the random streams (above); ``None`` for a DEQ that draws nothing.
      deterministic: the initial mode: ``False`` trains, ``True`` evaluates.
      solver, backward, z_init, train_max_iter, eval_max_iter, terms: shorthands for
        the fields of ``spec`` of the same names, as for `deq_jax.nn.DEQ`.

    Raises:
      TypeError: if ``cell`` is not an ``nnx.Module``, ``spec`` not a ``DEQSpec`` or
        ``rngs`` not an ``nnx.Rngs``.
      ValueError: for a bad shorthand (as `deq_jax.nn.DEQSpec`), or a cell holding an
        ``nnx.Dropout`` (use `deq_jax.nnx.VariationalDropout`).

    Example::

        cell = dj.nnx.MLPCell(in_features=16, features=32, rngs=nnx.Rngs(0))
        model = dj.nnx.DEQ(cell, spec=dj.nn.DEQSpec(train_max_iter=30), rngs=nnx.Rngs(1))
        z_star, stats = model(x)          # model.eval(): the evaluation budget

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (the penalty terms).
    """

    def __init__(
        self,
        cell: nnx.Module,
        spec: DEQSpec | None = None,
        *,
        rngs: nnx.Rngs | None = None,
        deterministic: bool = False,
        solver: Solver | None = None,
        backward: Backward | None = None,
        z_init: str | Callable[[Any], Any] | None = None,
        train_max_iter: int | None = None,
        eval_max_iter: int | None = None,
        terms: tuple[Term, ...] | None = None,
    ):
        if not isinstance(cell, nnx.Module):
            raise TypeError(f"cell must be an nnx.Module, got {type(cell).__name__}.")
        for path, module in nnx.iter_modules(cell):
            if isinstance(module, nnx.Dropout) and module.rate > 0:
                raise ValueError(
                    f"cell.{'.'.join(map(str, path))} is an nnx.Dropout: it draws its masks "
                    "from its own rng stream, which the solve's copies of the cell cannot "
                    "advance (every solve would reuse one mask). Use "
                    "deq_jax.nnx.VariationalDropout, which takes the DEQ's key per solve."
                )
        spec = DEQSpec() if spec is None else spec
        if not isinstance(spec, DEQSpec):
            raise TypeError(f"spec must be a deq_jax.nn.DEQSpec, got {spec!r}.")
        if rngs is not None and not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs must be an nnx.Rngs or None, got {type(rngs).__name__}.")
        given = dict(
            solver=solver,
            backward=backward,
            z_init=z_init,
            train_max_iter=train_max_iter,
            eval_max_iter=eval_max_iter,
            terms=terms,
        )
        given = {name: value for name, value in given.items() if value is not None}
        self.cell = cell
        self.spec = spec.replace(**given) if given else spec
        self.rngs = nnx.data(None if rngs is None else rngs.fork())
        self.deterministic = deterministic

    def solver_for(self, train: bool, max_iter: int | None = None) -> Solver:
        """The forward solver used for a call with these ``train`` and ``max_iter``."""
        return self.spec.solver_for(train, max_iter)

    def state_spec(self, x: Any) -> Any:
        """The state's spec for input ``x``: the cell's ``state_spec(x)``, else like ``x``."""
        spec_fn = getattr(self.cell, "state_spec", None)
        return spec_fn(x) if callable(spec_fn) else state_like(x)

    def __call__(
        self,
        x: Any,
        z0: Any = None,
        *,
        train: bool | None = None,
        max_iter: int | None = None,
        stats_probe: jax.Array | None = None,
    ) -> tuple[Any, SolverStats]:
        """Solves ``z = cell(z, x)``.

        Args:
          x: the input injected into the cell at every iteration (any pytree the cell
            takes), batched along axis 0.
          z0: an explicit initial state; ``None`` builds one from ``spec.z_init``.
          train: training mode (dropout key, batch statistics, ``train_max_iter``);
            ``None`` follows ``model.train()`` / ``model.eval()``.
          max_iter: overrides the budget for this call (a Python int).
          stats_probe: an optional `deq_jax.backward.stats_probe()` whose gradient
            carries the backward solve's statistics.

        Returns:
          ``(z_star, stats)``: the fixed point (like the state, differentiable w.r.t.
          the cell's parameters and ``x`` through ``spec.backward``) and the solver's
          per-sample `deq_jax.SolverStats`. The values of ``spec.terms`` are sown as
          ``nnx.Intermediate`` values (class docstring: collect them with ``nnx.capture``).

        Raises:
          ValueError: if the cell's output does not match the state, an explicit ``z0``
            does not match the cell's ``state_spec``, or a ``"z0"`` or ``"jacobian"``
            key is needed and the DEQ has no such rng stream.
        """
        train = self._train(train)
        z0 = self.initial_state(x, z0)
        key = self._key("dropout") if train else None
        if train and nnx.state(self.cell, nnx.BatchStat):
            self._update_batch_stats(z0, x, key)
        f, z0, args, solver = self._problem(x, z0, train, max_iter, key)
        # the solver carries the call's budget; fixed_point checks the cell's output
        solve = lambda start, probe=None: fixed_point(
            f, start, args, solver=solver, backward=self.spec.backward_for(), stats_probe=probe
        )
        sol = solve(z0, stats_probe)
        if self.spec.terms:
            resolve = lambda start: solve(start).value
            values = evaluate_terms(self.spec.terms, f, sol.value, args, self._term_key, resolve)
            for name, value in values.items():
                self.sow(nnx.Intermediate, name, value)
        return sol.value, sol.stats

    def problem(
        self, x: Any, z0: Any = None, *, train: bool | None = None, max_iter: int | None = None
    ) -> EquilibriumProblem:
        """The fixed-point problem a call with these arguments solves, as pure pieces.

        Returns:
          A `deq_jax.nn.EquilibriumProblem` ``(f, z0, args, solver)``, as the linen
          layer's: ``f(z, args)`` is pure (``args = (cell state, x, dropout key)``, the
          state from ``nnx.split(model.cell)``), so ``deq_jax.fixed_point(f, z0, args,
          solver=solver)`` reproduces the forward solve and `deq_jax.analysis` can
          re-solve it from other starts. It draws the keys a call would draw (advancing
          the rng streams) but updates no batch statistics.

        Raises:
          ValueError: as `initial_state`.
        """
        train = self._train(train)
        z0 = self.initial_state(x, z0)
        key = self._key("dropout") if train else None
        return self._problem(x, z0, train, max_iter, key)

    def initial_state(self, x: Any, z0: Any = None) -> Any:
        """``z0`` checked against the cell's ``state_spec(x)``, or built from ``z_init``.

        Raises:
          ValueError: if ``z0`` does not match the spec, or ``z_init`` needs a ``"z0"``
            key and the DEQ has no such rng stream.
        """
        z_init = self.spec.z_init
        if z0 is None and callable(z_init):
            z0 = z_init(x)
        if z0 is None:
            key = None
            if z_init != "zeros":
                key = self._key("z0")
                if key is None:
                    raise ValueError(
                        f"z_init={z_init!r} draws the initial state from the 'z0' rng "
                        "stream: build the DEQ with rngs=nnx.Rngs(z0=...) (or a default "
                        "stream, nnx.Rngs(0)), or give z0 explicitly."
                    )
            return initial_state(self.state_spec(x), z_init, key)
        if callable(getattr(self.cell, "state_spec", None)):
            spec = self.cell.state_spec(x)
            if not _flat.same_specs(z0, spec):
                raise ValueError(
                    f"z0 must match the cell's state_spec(x), {_flat.describe(spec)}; "
                    f"got {_flat.describe(z0)}."
                )
        return z0

    def _train(self, train: bool | None) -> bool:
        return not self.deterministic if train is None else bool(train)

    def _key(self, stream: str) -> jax.Array | None:
        """A key from the DEQ's ``stream`` (or its default stream); ``None`` without."""
        if self.rngs is None or not hasattr(self.rngs, stream):
            return None
        return getattr(self.rngs, stream)()

    def _term_key(self, stream: str) -> jax.Array:
        """A penalty term's key (`deq_jax.regularizers.evaluate_terms`)."""
        key = self._key(stream)
        if key is None:
            users = ", ".join(type(t).__name__ for t in self.spec.terms if t.stream == stream)
            raise ValueError(
                f"{users} draw(s) from the {stream!r} rng stream: build the DEQ with "
                f"rngs=nnx.Rngs({stream}=...) (or a default stream, nnx.Rngs(0))."
            )
        return key

    def _update_batch_stats(self, z0: Any, x: Any, key: jax.Array | None) -> None:
        """Evaluates the cell once at ``z0`` (with the solve's dropout key) and writes its
        new batch statistics back: once per training call, as the linen layer does."""
        copy = nnx.merge(*nnx.split(self.cell))
        hand_keys(copy, key)
        copy(z0, x)
        nnx.update(self.cell, nnx.state(copy, nnx.BatchStat))

    def _problem(
        self, x: Any, z0: Any, train: bool, max_iter: int | None, key: jax.Array | None
    ) -> EquilibriumProblem:
        """`problem` from an initial state and a dropout key already drawn."""
        solver = self.solver_for(train, max_iter)
        graphdef, state = nnx.split(self.cell)

        def merged(cell_state: Any, dropout_key: jax.Array | None) -> nnx.Module:
            cell = nnx.merge(graphdef, cell_state)  # a copy: nothing is written back
            hand_keys(cell, dropout_key)
            return cell

        if callable(getattr(self.cell, "prepare", None)):
            # the cell's state-independent work, once per solve instead of per iteration
            x = merged(state, key).prepare(x)

        def f(z, args):
            cell_state, x_in, dropout_key = args
            cell = lambda z_c, s, x_c: merged(s, dropout_key)(z_c, x_c)
            # spec.precision: the cell's arithmetic; the solver's state stays float32
            return self.spec.constrain_state(self.spec.in_precision(cell, z, cell_state, x_in))

        z0 = self.spec.constrain_state(z0)  # spec.state_sharding: rows like the activations
        return EquilibriumProblem(f, z0, (state, x, key), solver)
