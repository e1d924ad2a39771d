"""Readable summaries of solver statistics (what ``print(stats)`` shows).

A `deq_jax.SolverStats` holds per-sample arrays and a ``[..., max_iter]`` residual trace;
printed whole, a batch of 256 samples fills a screen. `stats_summary` reduces it to one
line (steps, residuals, how many converged or diverged, the shapes) and prints the trace
only when asked. Under `jax.jit` the fields are tracers: the summary then names their
shapes and dtypes, and never reads a value.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from deq_jax import _flat


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic)


def _readable(x: Any) -> bool:
    """Whether ``x``'s values can be read here (not a tracer, all shards addressable)."""
    if isinstance(x, jax.core.Tracer):
        return False
    return getattr(x, "is_fully_addressable", True)


def _fields(stats: Any) -> dict[str, Any]:
    return {name: value for name, value in stats._asdict().items() if value is not None}


def _plain(stats: Any) -> str:
    """The field-by-field repr a NamedTuple would print (for fields that are not arrays,
    e.g. the shapes or axes that `jax.tree_util` maps a `SolverStats` to)."""
    body = ", ".join(f"{name}={value!r}" for name, value in stats._asdict().items())
    return f"{type(stats).__name__}({body})"


def _shapes(stats: Any) -> str:
    """The fields' dtypes and shapes, for stats whose values cannot be read (tracers)."""
    body = ", ".join(f"{name}={_flat.describe(value)}" for name, value in _fields(stats).items())
    return f"{type(stats).__name__}(traced: {body})"


def _num(x: float) -> str:
    return f"{x:.3g}"


def _counts(values: np.ndarray) -> str:
    codes, counts = np.unique(values, return_counts=True)
    return " ".join(f"{code}:{count}" for code, count in zip(codes, counts, strict=True))


def _values(stats: Any) -> str:
    """The one-line summary of concrete statistics."""
    nstep = np.asarray(stats.nstep)
    trace = np.asarray(stats.trace)
    head = f"shape {list(nstep.shape)}, budget {trace.shape[-1] if trace.ndim else '?'}"
    if nstep.size == 0:
        return f"{type(stats).__name__}({head}, no samples)"
    abs_res, rel_res = np.asarray(stats.abs_residual), np.asarray(stats.rel_residual)
    parts = [
        head,
        f"nstep mean {_num(nstep.mean())} max {nstep.max()}",
        f"abs_residual mean {_num(abs_res.mean())} max {_num(abs_res.max())}",
        f"rel_residual mean {_num(rel_res.mean())} max {_num(rel_res.max())}",
        f"converged {int(np.sum(stats.converged))}/{nstep.size}",
        f"diverged {int(np.sum(stats.diverged))}/{nstep.size}",
    ]
    if stats.part is not None:
        parts.append(f"part {_counts(np.asarray(stats.part))}")
    if stats.switched_at is not None:
        parts.append(f"switched_at max {np.asarray(stats.switched_at).max()}")
    if getattr(stats, "floor", None) is not None:
        at_floor = int(np.sum(stats.at_floor))
        parts.append(f"floor mean {_num(np.asarray(stats.floor).mean())}")
        parts.append(f"at_floor {at_floor}/{nstep.size}")
    return f"{type(stats).__name__}({', '.join(parts)})"


def stats_summary(stats: Any, trace: bool = False) -> str:
    """A one-line summary of a `deq_jax.SolverStats` (its ``repr``).

    Args:
      stats: the statistics, with fields of any shape (``[B]``, ``[]``, or stacked, e.g.
        ``[steps, B]`` from a training loop): means and maxima run over all entries.
      trace: also print the whole residual trace, one row per sample, below the line.

    Returns:
      ``SolverStats(shape [B], budget K, nstep mean .. max .., abs_residual mean ..
      max .., rel_residual mean .. max .., converged n/B, diverged n/B)``, with the
      composed solvers' ``part`` counts (``code:samples``) and the latest
      ``switched_at``. Fields that are tracers (under `jax.jit`) print their shapes;
      fields that are not arrays (a `SolverStats` of shapes or axes) their own repr.
    """
    fields = _fields(stats)
    if not fields or not all(_is_array(v) for v in fields.values()):
        return _plain(stats)
    if not all(_readable(v) for v in fields.values()):
        return _shapes(stats)
    line = _values(stats)
    if not trace:
        return line
    rows = np.asarray(stats.trace)
    return f"{line}\ntrace:\n{np.array2string(rows, threshold=rows.size + 1, precision=3)}"


def value_summary(value: Any) -> str:
    """A pytree's leaves as ``dtype[shape]`` (e.g. a `Solution`'s ``value``), or their
    own repr if they are not arrays."""
    leaves = jax.tree_util.tree_leaves(value)
    if leaves and all(_is_array(x) for x in leaves):
        return _flat.describe(value)
    return repr(value)
