"""The CLRS report: six algorithms x three ways of running the processor.

For each algorithm and mode, trains (or, when the run's workdir already holds its final
checkpoint, loads) ``configs/clrs.py:<algorithm>`` with ``model.mode=<mode>`` in
``{workdir}/<algorithm>/<mode>``, evaluates every eval split of its best checkpoint on
``val`` (`deq_jax.training.run.selection`, as CLRS selects; the row's ``scored_step``) at
the model's eval budget and writes to ``{workdir}``:

* ``clrs_report.json``: one row per run: the CLRS score (pointer accuracy, Kruskal's
  edge F1 over the whole split) per graph size (``val`` at 16 nodes, ``test_<n>``),
  the mean and max processor steps per size, the training time (``train_seconds``
  of the run's ``length_generalization.json``: the wall time of the invocation that
  finished the training), and the goal: the DEQ column of Xhonneux et al. (2024) at 64
  nodes, with the gap to it; for the MSTs, the score of a reference rule per size
  (`REFERENCE_RULES`);
* ``clrs_report.md``: the same as a table;
* ``clrs_report.png``: the score and the steps against the graph size.

The report in ``{workdir}`` keeps the rows of earlier invocations for the algorithms,
modes and seeds this one does not run while their run directories are there
(`earlier_rows`), when they were run with the same ``--steps``, ``--set`` and
``--smoke`` and, like this one, with or without ``--seeds``; so running one algorithm at
a time into a workdir builds up one report.

With ``--seeds=0,1,2`` every algorithm and mode is trained once per train seed
(``train.seed``), each in its own ``{workdir}/<algorithm>/<mode>/seed<seed>``; the
table has a row per seed, then a row per algorithm and mode with the mean +- standard
deviation over seeds (`launch.seeds.aggregate`; ``summary`` in the JSON). Without it,
one run of the config's seed, as before.

With ``--combine=a/clrs_report.json,b/clrs_report.json`` nothing is trained or loaded:
the rows of earlier reports run with ``--seeds`` (e.g. one seed per workdir, machine
or day) are joined into one report in ``--workdir`` with the mean +- std over their
seeds (`combine_reports`); the reports must agree on ``--steps``, ``--set`` and
``--smoke``, and no algorithm, mode and seed may come twice.

With ``--answer_steps``, each deq-mode run's solves are also replayed
(`experiments.clrs.steps`) and every split gets the step at which the decoded answer
settled (``answer_mean``, ``answer_max``) and at which every node converged
(``node_mean``, ``node_max``); the table gains the answer's mean steps at 16 and 64
nodes and the figure a dotted line per deq run. It costs about four evaluations of the
model per step of the eval budget.

Modes: ``deq`` (the solver's fixed point, implicit gradients), ``hint_propagation``
(iterate to the fixed point, backprop through time), ``fixed_steps`` (the true number of
steps with hint supervision, CLRS's baseline).

Usage::

    python -m experiments.clrs.report --workdir /tmp/clrs_report \\
        [--algorithms=bellman_ford,bfs --modes=deq,fixed_steps --steps=2000 --smoke]
        [--set=regularizer.jacobian_weight=0.1 --set=model.processor=triplet_mpnn]
        [--answer_steps] [--seeds=0,1,2]
    python -m experiments.clrs.report --workdir /tmp/clrs_all \\
        --combine=/tmp/seed0/clrs_report.json,/tmp/seed1/clrs_report.json

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from configs.clrs import MODES, clrs_config
from deq_jax.models.clrs import ALGORITHMS, f1_from_counts
from deq_jax.training import NonFiniteLossError, SettleRule
from deq_jax.training.families import evaluate
from experiments.clrs import steps as clrs_steps
from experiments.clrs.report_files import (
    combine_reports,
    earlier_rows,
    merged_settings,
    run_workdir,
    sort_rows,
    write_clrs_report,
)
from experiments.clrs.tables import GOALS, report_row
from launch import flags as launch_flags
from launch import seeds
from launch.runs import apply_overrides, best_run, quiet


def define_flags() -> None:
    """Defines this program's flags (``--workdir`` comes from `launch.main`)."""
    flags.DEFINE_list("algorithms", list(ALGORITHMS), "CLRS algorithms to report.")
    flags.DEFINE_list("modes", list(MODES), "Modes: deq, hint_propagation, fixed_steps.")
    flags.DEFINE_integer("steps", 0, "Train steps of every run (0: the config's).")
    flags.DEFINE_boolean("smoke", False, "Tiny runs (the configs' smoke variants).")
    flags.DEFINE_boolean(
        "answer_steps",
        False,
        "Replay every deq run's solves for the step at which its answer settled "
        "(experiments.clrs.steps; about four model evaluations per budget step).",
    )
    flags.DEFINE_list(
        "seeds",
        [],
        "Train seeds, e.g. 0,1,2: one run per seed in <algorithm>/<mode>/seed<seed>, "
        "and the mean and std over them (default: one run of the config's seed).",
    )
    flags.DEFINE_list(
        "combine",
        [],
        "clrs_report.json files of earlier --seeds reports: join their rows into one "
        "report with the mean and std over seeds, training nothing (combine_reports).",
    )
    flags.DEFINE_multi_string(
        "set",
        [],
        "key=value config override for every run (repeatable), e.g. "
        "--set=regularizer.jacobian_weight=0.1 --set=model.processor=triplet_mpnn. Use a "
        "workdir of its own: a workdir's runs are only loaded under the config that trained them.",
    )


def run_config(
    algorithm: str,
    mode: str,
    steps: int = 0,
    smoke: bool = False,
    overrides: Sequence[str] = (),
    seed: int | None = None,
) -> Any:
    """The config of one run: ``configs/clrs.py:<algorithm>`` with ``mode`` (and
    ``smoke``) as its variants (`configs.clrs.get_config`: ``fixed_steps`` runs
    without the Jacobian regulariser and the training-graph augmentations, the modes
    other than ``deq`` without the edge state), ``steps`` if set, the ``key=value``
    ``overrides`` (`launch.runs.apply_overrides`), then ``train.seed=seed`` if given.
    """
    names = ([] if mode == "deq" else [mode]) + (["smoke"] if smoke else [])
    config = clrs_config(algorithm, ",".join(names))
    if steps:
        config.train.steps = steps
        config.train.warmup_steps = min(config.train.warmup_steps, steps // 10)
    config = apply_overrides(config, overrides)
    if seed is not None:
        config.train.seed = int(seed)
    return config


def split_nodes(config: Any, split: str) -> int:
    """Nodes per graph of an eval split (``val``: the training size)."""
    return config.task.train_nodes if split == "val" else int(split.removeprefix("test_"))


def split_score(metrics: dict[str, float]) -> float:
    """The CLRS score of a split: Kruskal's F1 from the split's combined counts (exact
    over several batches), else the combined per-graph score."""
    if "true_positives" in metrics:
        counts = (metrics[k] for k in ("true_positives", "false_positives", "false_negatives"))
        return float(f1_from_counts(*counts))
    return float(metrics["score"])


def evaluate_run(run: Any, config: Any) -> dict[str, dict[str, float]]:
    """Score and processor steps of every eval split at the model's eval budget."""
    evaluator = evaluate.Evaluator(
        run.model,
        run.task,
        run.mesh,
        config.eval.batch_size,
        settle=SettleRule.from_config(config.deq),
    )
    out = {}
    for split, metrics in evaluator.evaluate_splits(run.state, run.task.eval_splits).items():
        out[split] = dict(
            nodes=split_nodes(config, split),
            score=split_score(metrics),
            nstep_mean=float(metrics["nstep_mean"]),
            nstep_max=float(metrics["nstep_max"]),
            count=int(metrics["count"]),
        )
        if "true_positives" in metrics:  # an edge mask: the predict-every-edge reference
            out[split]["all_edges_score"] = run.task.all_edges_score(split)
        if config.task.algorithm == "mst_prim":  # the lightest-neighbour reference
            out[split]["lightest_neighbour_score"] = run.task.lightest_neighbour_score(split)
    return out


def add_answer_steps(run: Any, config: Any, splits: dict[str, dict]) -> None:
    """Adds the replayed step counts of a deq run (`experiments.clrs.steps`) to each split:
    ``answer_mean`` / ``answer_max`` (the decoded answer settled) and ``node_mean`` /
    ``node_max`` (every node converged)."""
    for split, result in clrs_steps.profile_splits(run, tuple(splits), config, quiet).items():
        for key in ("answer", "node"):
            splits[split][f"{key}_mean"] = result[key]["mean"]
            splits[split][f"{key}_max"] = result[key]["max"]


def run_report(
    root: str,
    algorithms: Sequence[str],
    modes: Sequence[str],
    *,
    steps: int = 0,
    smoke: bool = False,
    overrides: Sequence[str] = (),
    answer_steps: bool = False,
    train_seeds: Sequence[int] = (),
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trains or loads every run, evaluates its best checkpoint and writes the JSON,
    markdown and PNG (``answer_steps``: with the deq runs' replayed step counts,
    `add_answer_steps`; ``train_seeds``: a run per seed and the mean and standard
    deviation over them, `summary_rows`)."""
    rows = []
    for algorithm in algorithms:
        for mode in modes:
            for seed in train_seeds or [None]:
                workdir = run_workdir(root, algorithm, mode, seed)
                tag = {} if seed is None else {"seed": seed}  # the row's seed, if any
                config = run_config(algorithm, mode, steps, smoke, overrides, seed)
                name = algorithm + "/" + mode + ("" if seed is None else f"/seed{seed}")
                emit(f"[{name}] training or loading in {workdir}")
                try:
                    run, step, which = best_run(config, workdir, emit=quiet)
                except NonFiniteLossError as err:  # a diverged run is a result too
                    emit(f"[{name}] diverged: {err}")
                    goal = GOALS[algorithm]
                    rows.append(
                        dict(algorithm=algorithm, mode=mode, goal=goal, diverged=str(err), **tag)
                    )
                    continue
                splits = evaluate_run(run, config)
                if answer_steps and mode == "deq":
                    add_answer_steps(run, config, splits)
                row = report_row(algorithm, mode, splits, evaluate.read_train_seconds(workdir))
                row.update(scored_step=step, checkpoint=which, **tag)
                rows.append(row)
                brief = {k: v for k, v in row.items() if k != "splits"}
                emit(f"[{name}] {json.dumps(brief)}")
    extra = dict(
        seeds=list(train_seeds),
        steps=steps,
        smoke=smoke,
        overrides=list(overrides),
        answer_steps=answer_steps,
    )
    kept = earlier_rows(root, extra, rows, emit)
    if kept:
        rows += kept
        sort_rows(rows)
        merged = merged_settings(rows)
        extra.update(merged, answer_steps=answer_steps or merged["answer_steps"])
    return write_clrs_report(root, rows, extra, emit)


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    flag = flags.FLAGS
    for name, given, valid in (
        ("algorithm", flag.algorithms, ALGORITHMS),
        ("mode", flag.modes, MODES),
    ):
        unknown = [v for v in given if v not in valid]
        if unknown:
            raise app.UsageError(f"Unknown {name} {unknown}. Valid: {', '.join(valid)}.")
    if flag.combine:
        given = [
            f"--{n}" for n in ("seeds", "steps", "set", "smoke", "answer_steps") if flag[n].present
        ]
        if given:
            raise app.UsageError(
                f"--combine trains nothing: {', '.join(given)} would not apply; the combined "
                "reports keep the settings they were run with."
            )
        combine_reports(
            launch_flags.WORKDIR.value,
            flag.combine,
            flag.algorithms,
            flag.modes,
            emit=lambda line: print(line, flush=True),
        )
        return
    run_report(
        launch_flags.WORKDIR.value,
        flag.algorithms,
        flag.modes,
        steps=flag.steps,
        smoke=flag.smoke,
        overrides=flag.set,
        answer_steps=flag.answer_steps,
        train_seeds=seeds.parse_seeds(flag.seeds) if flag.seeds else (),
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["workdir"])  # --workdir is launch.main's flag
    app.run(main)
