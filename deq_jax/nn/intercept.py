"""Model interception: a task model's DEQ call, seen and steered from outside the model.

A task model wraps its `deq_jax.nn.DEQ` between an input projection and a readout.
`deq_call` runs the model in eval mode while intercepting the call of its (first) DEQ:
it can replace the DEQ's initial state or budget, and it captures the fixed point, the
solver statistics and the DEQ's problem as pure pieces (`deq_jax.nn.EquilibriumProblem`:
``f(z, args)``, ``z0``, ``args``, ``solver``), what the cell-level tools of
`deq_jax.analysis` and the neural-solver fit of `deq_jax.training` work on. Also:

* `outputs_at`: the model's outputs read out from a given state instead of a solve;
* `settled_apply`: the model in eval mode with its DEQ stopping each sample once the
  model's decoded answer stops changing (`deq_jax.fixed_point.solve_until_settled`).

Nothing here changes the model's code: the interception uses
`flax.linen.intercept_methods`.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022
  (Section 4.2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.fixed_point import solve_until_settled
from deq_jax.nn.deq import DEQ, EquilibriumProblem
from deq_jax.solvers.base import SolverStats


class DEQCall(NamedTuple):
    """What `deq_call` saw.

    Attributes:
      outputs: the model's outputs.
      z_star: the fixed point of the model's first DEQ.
      stats: that DEQ's per-sample `deq_jax.SolverStats`.
      problem: that DEQ's `EquilibriumProblem` (with the initial state actually used).
    """

    outputs: Any
    z_star: Any
    stats: SolverStats
    problem: EquilibriumProblem


def model_result(result: Any) -> tuple[Any, SolverStats]:
    """``(outputs, stats)`` of a model call: task models return that pair; a model that
    returns one result object with a ``stats`` field (the language model's
    `deq_jax.models.language.LMOutput`) has that object as its outputs."""
    if hasattr(result, "_fields") and "stats" in result._fields:
        return result, result.stats
    outputs, stats = result
    return outputs, stats


def _apply_with_first_deq(
    model: nn.Module,
    variables: Any,
    inputs: Any,
    on_deq: Callable[..., Any],
    *,
    strict: bool = True,
    **apply_kwargs: Any,
) -> Any:
    """``model.apply(variables, inputs, train=False, **apply_kwargs)`` with the call of its
    first `DEQ` replaced by ``on_deq(next_fun, x, z0, kwargs, deq)`` (``next_fun`` runs
    the DEQ as usual; later DEQ calls, e.g. from ``on_deq`` itself, run as usual).

    Raises:
      ValueError: if ``strict`` and the model called no `DEQ`.
    """
    seen: list[bool] = []

    def interceptor(next_fun, args, kwargs, context):
        if seen or not isinstance(context.module, DEQ) or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        seen.append(True)
        kwargs = dict(kwargs)
        x, start = args[0], (args[1] if len(args) > 1 else kwargs.pop("z0", None))
        return on_deq(next_fun, x, start, kwargs, context.module)

    with nn.intercept_methods(interceptor):
        result = model.apply(variables, inputs, train=False, **apply_kwargs)
    if strict and not seen:
        raise ValueError(f"{type(model).__name__} called no deq_jax.nn.DEQ.")
    return result


def deq_call(
    model: nn.Module,
    variables: Any,
    inputs: Any,
    *,
    z0: Any = None,
    max_iter: int | None = None,
    rngs: dict[str, jax.Array] | None = None,
    **model_kwargs: Any,
) -> DEQCall:
    """Applies ``model`` in eval mode, intercepting its first `DEQ` call.

    Args:
      model: a linen model holding at least one `deq_jax.nn.DEQ`.
      variables: its variables.
      inputs: the model's inputs.
      z0: the initial state of the DEQ's solve (``None``: its ``z_init``).
      max_iter: the DEQ's budget (``None``: the model's eval budget).
      rngs: rngs of the call (``{"z0": key}`` for a random ``z_init``).
      **model_kwargs: more keywords of the model call (e.g. ``adjacency``).

    Returns:
      A `DEQCall`.

    Raises:
      ValueError: if the model called no `DEQ`.
    """
    seen: list[tuple[EquilibriumProblem, Any]] = []

    def on_deq(next_fun, x, start, kwargs, deq):
        if z0 is not None:
            start = z0
        if max_iter is not None:
            kwargs["max_iter"] = max_iter
        problem = deq.problem(x, start, train=kwargs["train"], max_iter=kwargs.get("max_iter"))
        out = next_fun(x, problem.z0, **kwargs)
        seen.append((problem, out))
        return out

    outputs, _ = model_result(
        _apply_with_first_deq(model, variables, inputs, on_deq, rngs=rngs, **model_kwargs)
    )
    problem, (z_star, stats) = seen[0]
    return DEQCall(outputs, z_star, stats, problem)


def outputs_at(
    model: nn.Module, variables: Any, inputs: Any, z_star: Any, **model_kwargs: Any
) -> Any:
    """The model's outputs when its (first) DEQ returns ``z_star``, without a solve.

    Reads attacked (or any other) fixed points out through the model's readout: the DEQ
    call is replaced by ``z_star`` (checked against the cell's ``state_spec``) and
    placeholder statistics (one step, converged), so the cell is not evaluated unless
    the readout itself calls it.

    Raises:
      ValueError: if the model called no `DEQ`, or ``z_star`` does not fit its cell.
    """

    def on_deq(next_fun, x, start, kwargs, deq):
        z = deq.initial_state(x, z_star)
        return z, _placeholder_stats(z)

    outputs, _ = model_result(
        _apply_with_first_deq(model, variables, inputs, on_deq, **model_kwargs)
    )
    return outputs


def _placeholder_stats(z: Any) -> SolverStats:
    """Statistics of a state taken as given: one step, converged, zero residual."""
    batch = jax.tree_util.tree_leaves(z)[0].shape[0]
    zeros = jnp.zeros((batch,), jnp.float32)
    return SolverStats(
        nstep=jnp.ones((batch,), jnp.int32),
        abs_residual=zeros,
        rel_residual=zeros,
        converged=jnp.ones((batch,), bool),
        diverged=jnp.zeros((batch,), bool),
        trace=zeros[:, None],
    )


def argmax_answer(outputs: jax.Array) -> jax.Array:
    """The decoded answer of classification logits: the argmax over the last axis."""
    return jnp.argmax(outputs, axis=-1)


def settled_apply(
    model: nn.Module,
    variables: Any,
    inputs: Any,
    *,
    patience: int = 2,
    answer: Callable[[Any], Any] = argmax_answer,
    max_iter: int | None = None,
    tol: float | None = None,
    rngs: dict[str, jax.Array] | None = None,
    strict: bool = True,
    **model_kwargs: Any,
) -> tuple[Any, SolverStats]:
    """Applies ``model`` in eval mode; its first `DEQ` also stops once the answer settles.

    Each sample's solve stops when the model's decoded answer, ``answer(outputs)`` read
    out at the current iterate (`outputs_at`), has been the same for ``patience``
    evaluations in a row, or when the residual passes the solver's ``tol``, whichever
    comes first (`deq_jax.fixed_point.solve_until_settled`). The model then decodes the
    state it stopped at. Each step also runs the model's readout at the iterate (the
    input projection and the decoder; `outputs_at` skips the DEQ). Forward only.

    Args:
      model: a linen model whose ``apply(variables, inputs, train=False, ...)`` returns
        ``(outputs, stats)`` and calls a `deq_jax.nn.DEQ`.
      variables: its variables.
      inputs: its inputs.
      patience: evaluations in a row with an unchanged answer that stop a sample.
      answer: ``outputs -> pytree`` of discrete arrays with the batch axis first (by
        default the argmax of the logits).
      max_iter: the DEQ's budget (``None``: the model's eval budget).
      tol: the residual tolerance of the solve (``None``: the solver's). A smaller one
        leaves the stop to the answer: a graph's whole-state residual passes a loose
        tolerance sooner the larger the graph, while some nodes still move.
      rngs: rngs of the call.
      strict: raise if the model calls no `DEQ`; with ``False`` such a model (a CLRS
        model in ``fixed_steps`` or ``hint_propagation`` mode) is applied as usual.
      **model_kwargs: more keywords of the model call.

    Returns:
      ``(outputs, stats)`` as the model returns them; ``stats.nstep`` counts the
      evaluations of the cell until each sample stopped.

    Raises:
      ValueError: if ``strict`` and the model called no `DEQ`, or for a ``patience``
        below 1.
    """

    def readout(z):
        return answer(outputs_at(model, variables, inputs, z, **model_kwargs))

    def on_deq(next_fun, x, start, kwargs, deq):
        # the readout's own model calls pass: only the first DEQ call is handed here
        problem = deq.problem(x, start, train=kwargs["train"], max_iter=kwargs.get("max_iter"))
        solver = problem.solver if tol is None else problem.solver.replace(tol=tol)
        sol = solve_until_settled(
            problem.f, problem.z0, problem.args, solver=solver, readout=readout, patience=patience
        )
        return sol.value, sol.stats

    call_kwargs = dict(model_kwargs) if max_iter is None else dict(model_kwargs, max_iter=max_iter)
    return model_result(
        _apply_with_first_deq(
            model, variables, inputs, on_deq, strict=strict, rngs=rngs, **call_kwargs
        )
    )
