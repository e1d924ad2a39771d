r"""Benchmarks deq_jax's solvers against jaxopt on the DEQ cell z = tanh(W z + U x + b).

For each problem ("easy": W Gaussian with spectral norm 0.9; "hard": W symmetric with
spectral norm 0.99 and a weak input injection, where plain iteration is slow;
"norm<value>": the easy problem's Gaussian draw scaled to spectral norm <value>, e.g.
norm3.0, where the cell need not contract) and each relative tolerance, every solver --
ours (Broyden also with its whole budget as memory, "broyden_whole_budget") and jaxopt's
FixedPointIteration and AndersonAcceleration -- solves the identical batch with the
identical stopping rule:
per sample, ||f(z) - z|| <= tol_abs, where tol_abs = rel_tol x min_b ||z*_b|| (jaxopt
is vmapped over the batch so it stops per sample too). One JSON line per (problem,
tol, solver) reports f-evaluations, the final relative residual, median wall time
after compilation, compile time, the time of one implicit (IFT) backward pass, and the
solver overhead wall / (f-evaluations x time of one f call), and step_time_ratio: the
wall time per f-evaluation relative to fixed_point_iteration's on the same problem and
tolerance (the per-step cost of a solver in fixed-point steps). Last lines give the
compiled memory of one training step for several forward budgets, with IFT and
unrolled gradients. A PNG of residual vs iteration is written next to the JSON lines.

Full run (width 256, batch 64), as recorded in BUILD_NOTES.md:

  python -m benchmarks.solvers --output /tmp/bench/solvers.jsonl

The spectral-norm sweep of BUILD_NOTES.md:

  python -m benchmarks.solvers --problems norm0.9,norm1.5,norm2.5,norm3.0 --repeats 5 \
      --memory_budgets= --output /tmp/bench/norms.jsonl

A quick run:

  python -m benchmarks.solvers --width 32 --batch 8 --repeats 2 --output /tmp/b.jsonl

The loop's fixed cost against jaxopt on the easy problem, interleaved
(`benchmarks.loop_cost`; the tolerance 1e-4 per sample):

  python -m benchmarks.solvers --loop_cost --tols 1e-4 --repeats 41

The composed solvers against their parts (on ``norm<value>`` problems):
``benchmarks/composed.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import jaxopt
import numpy as np
import optax
from absl import app, flags

import deq_jax as dj
from benchmarks.loop_cost import loop_cost
from benchmarks.solver_problems import cell, header, json_lines, make_problem

_WIDTH = flags.DEFINE_integer("width", 256, "State width D.")
_BATCH = flags.DEFINE_integer("batch", 64, "Batch size B.")
_TOLS = flags.DEFINE_list("tols", ["1e-4", "1e-6"], "Relative tolerances.")
_PROBLEMS = flags.DEFINE_list(
    "problems", ["easy", "hard"], "Problems: easy, hard, norm<value> (e.g. norm2.5)."
)
_MAX_ITER = flags.DEFINE_integer("max_iter", 500, "Forward iteration budget.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed runs per measurement (median).")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed of the problem.")
_MEMORY_BUDGETS = flags.DEFINE_list("memory_budgets", ["30", "120"], "max_iter for memory.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON lines path (a PNG is written beside).")
_LOOP_COST = flags.DEFINE_bool(
    "loop_cost", False, "Only the loop's fixed cost against jaxopt, interleaved (loop_cost.py)."
)


def timed(fn, *args, repeats: int) -> tuple[float, object]:
    """Median wall seconds of ``fn(*args)`` after one warm-up call, and its output."""
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def compile_seconds(fn, *args) -> float:
    start = time.perf_counter()
    fn.lower(*args).compile()
    return time.perf_counter() - start


def time_of_one_f(w, inj, repeats: int, calls: int = 200) -> float:
    """Seconds per f call on the batch, from a compiled loop of ``calls`` calls."""
    loop = jax.jit(lambda z: jax.lax.fori_loop(0, calls, lambda _, z: cell(z, (w, inj)), z))
    seconds, _ = timed(loop, jnp.zeros_like(inj), repeats=repeats)
    return seconds / calls


def relative_residual(z, w, inj) -> np.ndarray:
    fz = cell(z, (w, inj))
    return np.asarray(jnp.linalg.norm(fz - z, axis=1) / (jnp.linalg.norm(fz, axis=1) + 1e-8))


def probe_loss(solve_fn, probe):
    return lambda w, inj: jnp.sum(probe * solve_fn(w, inj))


def backward_seconds(solve_fn, w, inj, repeats: int) -> float:
    """Median seconds of the VJP pass alone (the forward is done beforehand)."""
    fwd = jax.jit(lambda w, inj: jax.vjp(lambda w: solve_fn(w, inj), w))
    bwd = jax.jit(lambda vjp_fn, g: vjp_fn(g))
    _, vjp_fn = fwd(w, inj)
    seconds, _ = timed(bwd, vjp_fn, jnp.ones_like(inj), repeats=repeats)
    return seconds


# Benchmark entries that are one of our solvers with other hyper-parameters.
VARIANTS = {"broyden_whole_budget": ("broyden", dict(memory=None))}


def ours(name: str, tol_abs: float, max_iter: int):
    name, hyper = VARIANTS.get(name, (name, {}))
    solver = dj.solvers.get(name, tol=tol_abs, max_iter=max_iter, stop_mode="abs", **hyper)
    mode = dj.backward.ift(solver=solver)

    def solve(w, inj):
        return dj.fixed_point(cell, jnp.zeros_like(inj), (w, inj), solver=solver, backward=mode)

    run = jax.jit(solve)
    value_fn = lambda w, inj: solve(w, inj).value

    def report(out):
        nstep = np.asarray(out.stats.nstep)
        return dict(
            f_evals_max=int(nstep.max()),
            f_evals_mean=float(nstep.mean()),
            converged=float(np.mean(out.stats.converged)),
            trace=np.asarray(out.stats.trace)[:, : nstep.max()].mean(0),
        ), out.value

    return run, value_fn, report


def jaxopt_solver(name: str, tol_abs: float, max_iter: int):
    fp = lambda z, w, inj: jnp.tanh(w @ z + inj)  # one sample
    if name == "jaxopt_fixed_point_iteration":
        solver = jaxopt.FixedPointIteration(fixed_point_fun=fp, maxiter=max_iter, tol=tol_abs)
    else:
        solver = jaxopt.AndersonAcceleration(
            fixed_point_fun=fp, history_size=5, maxiter=max_iter, tol=tol_abs
        )
    batched = jax.vmap(lambda z0, w, inj: solver.run(z0, w, inj), in_axes=(0, None, 0))
    solve = lambda w, inj: batched(jnp.zeros_like(inj), w, inj)
    run = jax.jit(solve)
    value_fn = lambda w, inj: solve(w, inj).params

    def report(out):
        evals = np.asarray(out.state.num_fun_eval)
        return dict(
            f_evals_max=int(evals.max()),
            f_evals_mean=float(evals.mean()),
            converged=float(np.mean(np.asarray(out.state.error) <= tol_abs)),
        ), out.params

    return run, value_fn, report


SOLVERS = {
    "fixed_point_iteration": ours,
    "anderson": ours,
    "broyden": ours,
    "broyden_whole_budget": ours,
    "jaxopt_fixed_point_iteration": jaxopt_solver,
    "jaxopt_anderson": jaxopt_solver,
}


def benchmark_one(problem, rel_tol, name, w, inj, t_f, tol_abs, repeats):
    run, value_fn, report = SOLVERS[name](name, tol_abs, _MAX_ITER.value)
    compile_s = compile_seconds(run, w, inj)
    wall, out = timed(run, w, inj, repeats=repeats)
    fields, value = report(out)
    trace = fields.pop("trace", None)
    rel = relative_residual(value, w, inj)
    row = dict(
        problem=problem,
        rel_tol=rel_tol,
        abs_tol=tol_abs,
        solver=name,
        **fields,
        final_rel_residual_max=float(rel.max()),
        final_rel_residual_median=float(np.median(rel)),
        wall_ms=1e3 * wall,
        compile_s=compile_s,
        ift_backward_ms=1e3 * backward_seconds(value_fn, w, inj, repeats),
        f_call_ms=1e3 * t_f,
        overhead=wall / (fields["f_evals_max"] * t_f),
        seconds_per_eval=wall / fields["f_evals_max"],
    )
    return row, trace


def train_step_memory(max_iter: int, backward: str, width: int, batch: int) -> dict:
    """Compiled peak memory of one Adam training step of a DEQ classifier."""
    key = jax.random.PRNGKey(0)
    params = {
        "w": 0.5 * jax.random.normal(key, (width, width)) / jnp.sqrt(width),
        "u": jax.random.normal(key, (width, width)) / jnp.sqrt(width),
        "head": jnp.zeros((width, 10)),
    }
    x = jax.random.normal(key, (batch, width))
    labels = jnp.arange(batch) % 10
    solver = dj.solvers.anderson(tol=1e-12, max_iter=max_iter)  # never stops early
    mode = dj.backward.get(backward)
    optimizer = optax.adam(1e-3)

    def loss(p):
        sol = dj.fixed_point(
            cell, jnp.zeros_like(x), (p["w"], x @ p["u"].T), solver=solver, backward=mode
        )
        logits = sol.value @ p["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(p, opt_state):
        grads = jax.grad(loss)(p)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    compiled = jax.jit(step).lower(params, optimizer.init(params)).compile()
    stats = compiled.memory_analysis()
    # XLA's CPU backend leaves temporaries out of peak_memory_in_bytes: add them up.
    total = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )
    return dict(
        max_iter=max_iter,
        backward=backward,
        total_bytes=int(total),
        temp_bytes=int(stats.temp_size_in_bytes),
    )


def plot_traces(traces: dict, path: str) -> None:
    """Residual vs f-evaluations, one panel per (problem, tolerance), one line per solver."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = sorted({p for p, _, _ in traces})
    tols = sorted({t for _, t, _ in traces}, reverse=True)
    fig, axes = plt.subplots(
        len(problems), len(tols), figsize=(5 * len(tols), 3.6 * len(problems)), squeeze=False
    )
    for (problem, tol, name), trace in traces.items():
        ax = axes[problems.index(problem)][tols.index(tol)]
        ax.semilogy(np.arange(1, trace.size + 1), trace, label=name)
        ax.set_title(f"{problem} problem, stop at |f(z)-z| <= {tol:g} x min|z*|")
        ax.set_xlabel("f evaluations")
        ax.set_ylabel("batch mean of |f(z) - z|")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run_all(emit) -> dict:
    """Every problem, tolerance and solver, then the memory rows; returns the traces."""
    traces = {}
    for problem in _PROBLEMS.value:
        w, inj = make_problem(problem, _WIDTH.value, _BATCH.value, _SEED.value)
        t_f = time_of_one_f(w, inj, _REPEATS.value)
        reference = dj.fixed_point(
            cell,
            jnp.zeros_like(inj),
            (w, inj),
            solver=dj.solvers.anderson(tol=1e-7, max_iter=2000),
        ).value
        z_norm_min = float(jnp.min(jnp.linalg.norm(cell(reference, (w, inj)), axis=1)))
        for rel_tol in map(float, _TOLS.value):
            seconds_per_eval = {}
            for name in SOLVERS:
                row, trace = benchmark_one(
                    problem, rel_tol, name, w, inj, t_f, rel_tol * z_norm_min, _REPEATS.value
                )
                # the cost of a step against a fixed-point step (FPI runs first) here
                seconds_per_eval[name] = row.pop("seconds_per_eval")
                fpi_seconds = seconds_per_eval["fixed_point_iteration"]
                row["step_time_ratio"] = seconds_per_eval[name] / fpi_seconds
                emit(row)
                if trace is not None:
                    traces[(problem, rel_tol, name)] = trace
    for backward in ("ift", "unrolled"):
        for budget in map(int, _MEMORY_BUDGETS.value):
            emit(
                dict(memory=True, **train_step_memory(budget, backward, _WIDTH.value, _BATCH.value))
            )
    return traces


def main(argv):
    del argv
    with json_lines(_OUTPUT.value) as emit:
        emit(header(_WIDTH.value, _BATCH.value, _MAX_ITER.value, _REPEATS.value))
        if _LOOP_COST.value:
            for tol in map(float, _TOLS.value):
                for row in loop_cost(_WIDTH.value, _BATCH.value, tol, _REPEATS.value):
                    emit(row)
            return
        traces = run_all(emit)
    if _OUTPUT.value:
        png = os.path.splitext(_OUTPUT.value)[0] + "_residuals.png"
        plot_traces(traces, png)
        print(json.dumps(dict(plot=png)))


if __name__ == "__main__":
    app.run(main)
