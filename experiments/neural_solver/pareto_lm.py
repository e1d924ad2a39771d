"""The language model's part of `experiments.neural_solver.pareto`: every solver streams
segments of a split with the segment memory (bits per character, residual, steps), and
the timing helper both sweeps share.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Figures 4, 8a).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


def timed(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn``, its result ready."""
    began = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - began


def _lm_segments(hyper: Any, split: str, batch_size: int, count: int, seq_len: int) -> list[Any]:
    """The first ``count`` segments of ``split`` in stream order (0: all), on the mesh."""
    from deq_jax.training.families.lm_evaluate import lm_device_batch

    run = hyper.deq
    batches = run.task.eval_iterator(split, batch_size, seq_len)
    return [lm_device_batch(b, run.mesh) for b in itertools.islice(batches, count or None)]


def sweep_lm(
    hyper: Any,
    lineup: dict[str, tuple[Any, Any]],
    split: str,
    budgets: Sequence[int],
    repeats: int,
    max_batches: int,
    batch_size: int,
    *,
    seq_len: int,
    cached: dict[str, list[dict[str, float]]] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """`sweep` for a language model: each solver streams the first ``max_batches``
    segments of ``split`` (0: all of them) with the segment memory (bits per character,
    residual, steps); the time is that of the second segment batch with the memory of
    the first. A solver in ``cached`` (its rows of an earlier sweep of the same segments
    and budgets) is only timed."""
    from deq_jax.training.families.lm_steps import make_lm_eval_step, place_memory

    run, frozen, cached = hyper.deq, hyper.frozen, cached or {}
    template = jax.tree_util.tree_map(np.asarray, run.model.init_mems(batch_size))
    segments = _lm_segments(hyper, split, batch_size, max_batches and max(max_batches, 2), seq_len)
    table: dict[str, list[dict[str, float]]] = {}
    to_time = {}
    for name, (solver, z_init) in lineup.items():
        for budget in budgets:
            model = frozen.with_solver(solver.replace(full_budget=True, max_iter=budget), z_init)
            step = make_lm_eval_step(model, run.mesh, template, max_iter=budget, donate=False)
            mems, totals = place_memory(template, run.mesh, batch_size), {}
            streamed = segments[:2] if name in cached else segments
            for i, batch in enumerate(streamed):
                if i == 1:
                    to_time[name, budget] = (step, mems, batch)
                mems, sums = step(run.state, mems, batch)
                for k, v in jax.device_get(sums).items():
                    totals[k] = totals.get(k, 0.0) + float(v)
            if name in cached:
                (row,) = [dict(r) for r in cached[name] if r["budget"] == budget]
            else:
                rows = max(totals["rows"], 1.0)
                row = dict(run.task.summarize(totals["nll_sum"], totals["count"]))
                row.update(
                    budget=budget,
                    nstep_mean=totals["nstep_sum"] / rows,
                    rel_residual=totals["rel_residual_sum"] / rows,
                    converged=totals["converged_sum"] / rows,
                )
            table.setdefault(name, []).append(row)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in to_time}
    for _ in range(repeats):  # interleaved, so every solver sees the same load
        for key, (step, mems, batch) in to_time.items():
            times[key].append(timed(lambda s=step, m=mems, b=batch: s(run.state, m, b)))
    for name, rows in table.items():
        for row in rows:
            row["seconds"] = float(np.median(times[name, row["budget"]]))
    return table


def residual_curves_lm(
    hyper: Any,
    lineup: dict[str, tuple[Any, Any]],
    split: str,
    steps_max: int,
    batch_size: int,
    *,
    seq_len: int,
) -> dict:
    """`residual_curves` for a language model: the second segment of ``split`` with the
    memory of the first."""

    from deq_jax.nn.intercept import deq_call

    run, frozen = hyper.deq, hyper.frozen
    first, second = _lm_segments(hyper, split, batch_size, 2, seq_len)
    mems = run.model.apply(
        frozen.variables, first["inputs"], mems=run.model.init_mems(batch_size), train=False
    ).mems
    curves = {}
    for name, (solver, z_init) in lineup.items():
        model = frozen.with_solver(
            solver.replace(full_budget=True, max_iter=steps_max, stop_mode="rel"), z_init
        )
        call = jax.jit(
            lambda v, x, m, model=model: (
                deq_call(model, v, x, max_iter=steps_max, mems=m).stats.trace
            )
        )
        trace = np.asarray(call(frozen.variables, second["inputs"], mems))  # [B, T]
        curves[name] = [float(x) for x in np.mean(trace, axis=0)]
    return curves
