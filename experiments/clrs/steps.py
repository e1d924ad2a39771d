"""When does a trained CLRS DEQ reach its answer, and does that grow with the graph?

Loads the latest checkpoint of a deq-mode CLRS run (nothing is trained) and, for every
graph of the chosen splits, replays the run's own solver at its eval budget
(`deq_jax.analysis.solver_trajectory`) and reads three step counts off the iterates:

* ``solver``: the steps the solver takes, its whole-state relative residual
  ``||f(z) - z|| / ||f(z)||`` at most ``solver.tol`` (what the report's steps count
  with ``deq.settle_patience=0``; the configs' evaluation also stops once the answer
  has settled, `deq_jax.analysis.settled_apply`, and these replays do not);
* ``node``: the steps until every node has converged, the worst node's relative
  residual (`deq_jax.analysis.node_residual`) at most ``solver.tol``. A graph that is
  four times larger around the same unsettled nodes passes the whole-state test about
  twice as early (the residual is diluted by ``sqrt(n)``); this one it passes alike;
* ``answer``: the step from which the decoded output (parents; Kruskal's edge mask)
  equals the model's final answer at every later step up to the solver's stop: when
  the model, read out, stops changing its mind (`deq_jax.analysis.settle_step`).

An algorithm's step count grows with the graph (Dijkstra and Prim take ``n + 1``
steps); these say whether the equilibrium model's does, and by which measure. Prints
the mean and max per split and writes ``{workdir}/clrs_steps.json`` and
``clrs_steps.png`` (the three means against the graph size, the max as a band).

Usage (pass the config and overrides the run was trained with)::

    python -m experiments.clrs.steps --config configs/clrs.py:mst_prim \\
        --workdir /tmp/clrs_report/mst_prim/deq [--splits=val,test_64]

Graph sizes the run was not tested on: ``"--config.task.test_nodes=(32,64,128)"``.
Costs about four evaluations of the model per replayed step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax import analysis
from deq_jax.solvers.base import residuals
from deq_jax.training import restore_trained
from launch import flags as launch_flags

launch_flags.define_splits_flag()

OUTPUT = "clrs_steps"  # .json and .png
MEASURES = ("solver", "node", "answer")


def profiler(run: Any) -> Callable[[Any, dict], dict]:
    """The jitted ``(variables, batch) -> per-graph step counts and checks`` of the run."""
    extras = tuple(run.task.batch_extras)
    model = run.model

    @jax.jit
    def profile(variables, batch):
        inputs = batch["inputs"]
        kw = {k: batch[k] for k in extras}
        call = analysis.deq_call(model, variables, inputs, **kw)
        problem, n = call.problem, inputs.shape[-1]

        def observe(z, fz):
            flat = lambda t: jnp.concatenate(
                [x.reshape(x.shape[0], -1) for x in jax.tree_util.tree_leaves(t)], axis=1
            )
            _, whole = residuals(flat(z), flat(fz))
            answer = analysis.outputs_at(model, variables, inputs, z, **kw).argmax(-1)
            return whole, analysis.node_residual(z, fz, n), answer

        whole, node, answer = analysis.solver_trajectory(
            problem.f, problem.z0, problem.args, solver=problem.solver, observe=observe
        )
        tol = problem.solver.tol
        return {
            "solver_reported": call.stats.nstep,
            "converged": call.stats.converged,
            "solver": analysis.first_below(whole, tol),
            "node": analysis.first_below(node, tol),
            "answer": analysis.settle_step(answer, call.outputs.argmax(-1), until=call.stats.nstep),
            "budget": jnp.full(inputs.shape[0], problem.solver.max_iter),
        }

    return profile


def profile_split(run: Any, split: str, batch_size: int, profile: Callable) -> dict:
    """Per-graph step counts of every real graph of ``split`` and their summary."""
    parts: dict[str, list[np.ndarray]] = {}
    for batch in run.task.eval_iterator(split, batch_size):
        real = np.asarray(batch["mask"]) > 0
        device = {k: batch[k] for k in ("inputs", *run.task.batch_extras)}
        for key, value in profile(run.state.variables(), device).items():
            parts.setdefault(key, []).append(np.asarray(value)[real])
    graphs = {k: np.concatenate(v) for k, v in parts.items()}
    result: dict[str, Any] = {
        "nodes": run.task.config.nodes(split),
        "graphs": int(len(graphs["solver"])),
        "budget": int(graphs["budget"][0]),
        "converged": float(graphs["converged"].mean()),
        # the replay against the solve it replays: equal up to float rounding
        "replay_agrees": float((graphs["solver"] == graphs["solver_reported"]).mean()),
    }
    result["solver_reported_mean"] = float(graphs["solver_reported"].mean())
    done = graphs["converged"]
    for key in MEASURES:
        result[key] = {
            "mean": float(graphs[key].mean()),
            "max": int(graphs[key].max()),
            # without the graphs that ran out of budget (they count the whole budget)
            "mean_converged": float(graphs[key][done].mean()) if done.any() else None,
        }
    return result


def profile_run(
    config: Any, workdir: str, splits: Sequence[str] = (), emit: Callable[[str], None] = print
) -> dict[str, dict]:
    """`profile_split` of every split of the trained deq-mode run in ``workdir``.

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint.
      ValueError: for a task other than CLRS, or a mode other than ``deq``.
    """
    if config.task.name != "clrs":
        raise ValueError(f"clrs_steps takes a CLRS run, not {config.task.name!r}.")
    if config.model.mode != "deq":
        raise ValueError(
            f"clrs_steps replays a deq-mode solve; this run's mode is {config.model.mode!r}."
        )
    run = restore_trained(config, workdir, "to profile")
    return profile_splits(run, tuple(splits) or tuple(run.task.eval_splits), config, emit)


def profile_splits(
    run: Any, splits: Sequence[str], config: Any, emit: Callable[[str], None] = print
) -> dict[str, dict]:
    """`profile_split` of each of ``splits`` of a loaded deq-mode run (one compilation
    per graph size)."""
    profile = profiler(run)
    report = {}
    for split in splits:
        report[split] = profile_split(run, split, config.eval.batch_size, profile)
        emit(format_split(split, report[split]))
    return report


def format_split(split: str, result: dict) -> str:
    """One split's step counts as a line of text."""
    cells = ", ".join(
        f"{key} {result[key]['mean']:.1f} (max {result[key]['max']})" for key in MEASURES
    )
    converged = ", ".join(
        f"{key} " + ("-" if (m := result[key]["mean_converged"]) is None else f"{m:.1f}")
        for key in MEASURES
    )
    return (
        f"{split} ({result['nodes']} nodes, {result['graphs']} graphs, "
        f"{100 * result['converged']:.0f}% converged): mean steps {cells}; "
        f"over the converged graphs {converged}"
    )


def write_figure(report: dict[str, dict], path: str) -> str:
    """The three mean step counts against the graph size (max as a band); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(report.values(), key=lambda r: r["nodes"])
    nodes = [r["nodes"] for r in rows]
    labels = {
        "solver": "solver (whole-state residual <= tol)",
        "node": "every node (worst node's residual <= tol)",
        "answer": "answer settled (decoded output final)",
    }
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key in MEASURES:
        means = [r[key]["mean"] for r in rows]
        line = ax.plot(nodes, means, marker="o", label=labels[key])[0]
        ax.fill_between(
            nodes, means, [r[key]["max"] for r in rows], color=line.get_color(), alpha=0.1
        )
    ax.axhline(rows[0]["budget"], color="grey", lw=0.8, ls=":", label="eval budget")
    ax.set_xscale("log", base=2)
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel("nodes per graph")
    ax.set_ylabel("steps (mean; band up to the max)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str]) -> None:
    launch_flags.run_split_tool(argv, profile_run, write_figure, OUTPUT)


if __name__ == "__main__":
    launch_flags.run(main)
