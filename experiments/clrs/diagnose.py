"""Breaks a trained CLRS model's errors down (`deq_jax.models.clrs.diagnostics`).

Loads the latest checkpoint of a CLRS run (nothing is trained), predicts every graph
of the chosen splits and prints, per split: the score, the accuracy by depth in the
true tree, the share of wrong parents that reverse a tree edge or are no neighbour,
the accuracy by the node's number of neighbours and, for Bellman-Ford and Dijkstra, how
much longer the path through the predicted parent is (near-ties). For MST-Prim it adds
the lightest-neighbour rule's score (`ClrsTask.lightest_neighbour_score`). For
MST-Kruskal's edge mask it prints which edges the model keeps (`edge_mask_errors`: the
tree edges, the non-tree edges that are a triangle's heaviest, the other non-tree
edges) and the F1 of keeping every edge and of dropping the triangles' heaviest. Writes
``{workdir}/clrs_diagnostics.json`` and ``clrs_diagnostics.png`` (pointers: accuracy
against depth in the true tree, one line per split; Kruskal: the kept and dropped
shares per split).

Usage (pass the config and overrides the run was trained with)::

    python -m experiments.clrs.diagnose --config configs/clrs.py:mst_prim \\
        --workdir /tmp/clrs_report/mst_prim/deq [--splits=val,test_64] \\
        [--config.model.hidden=128]

A run of `experiments.clrs.report` lives in ``{report workdir}/<algorithm>/<mode>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from deq_jax.models.clrs import diagnostics
from deq_jax.training import SettleRule, restore_trained
from launch import flags as launch_flags

launch_flags.define_splits_flag()

SHORTEST_PATHS = ("bellman_ford", "dijkstra")
OUTPUT = "clrs_diagnostics"  # .json and .png
MIN_NODES_PLOTTED = 10  # a depth bin with fewer nodes is left out of the figure


def predictor(run: Any, settle: SettleRule | None = None) -> Callable[[Any, dict], Any]:
    """The jitted ``(variables, batch) -> parents`` (or Kruskal's 0/1 edge mask) of the
    run's model at its eval budget, stopping as its evaluation does (``settle``, a
    `deq_jax.training.SettleRule`, e.g. from the config's ``eval`` section:
    `deq_jax.analysis.settled_apply`; ``None``: the residual test only)."""
    extras = tuple(run.task.batch_extras)
    settle = settle or SettleRule()

    @jax.jit
    def predict(variables, batch):
        kw = {k: batch[k] for k in extras}
        outputs, _ = settle.apply(run.model, variables, batch["inputs"], **kw)
        return outputs.argmax(-1)

    return predict


def predictions(
    run: Any, split: str, batch_size: int, predict: Callable[[Any, dict], Any]
) -> dict[str, np.ndarray]:
    """The model's parents or edge mask (``predict``, `predictor`) and the batch arrays
    of every real example of ``split``."""
    extras = tuple(run.task.batch_extras)
    keep = ("targets", "inputs", "input_A")
    parts: dict[str, list[np.ndarray]] = {"predicted": [], **{k: [] for k in keep}}
    for batch in run.task.eval_iterator(split, batch_size):
        real = np.asarray(batch["mask"]) > 0
        device = {k: batch[k] for k in ("inputs", *extras)}
        parts["predicted"].append(np.asarray(predict(run.state.variables(), device))[real])
        for key in keep:
            parts[key].append(np.asarray(batch[key])[real])
    return {k: np.concatenate(v) for k, v in parts.items()}


def diagnose_run(
    config: Any, workdir: str, splits: Sequence[str] = (), emit: Callable[[str], None] = print
) -> dict[str, dict]:
    """`pointer_errors` (Kruskal: `edge_mask_errors`) of every split of the trained run
    in ``workdir``.

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint.
      ValueError: for a task other than CLRS.
    """
    if config.task.name != "clrs":
        raise ValueError(f"clrs_diagnose takes a CLRS run, not {config.task.name!r}.")
    run = restore_trained(config, workdir, "to diagnose")
    algorithm = config.task.algorithm
    # one jitted function: splits of one size share its compilation
    predict = predictor(run, SettleRule.from_config(config.deq))
    report = {}
    for split in tuple(splits) or tuple(run.task.eval_splits):
        arrays = predictions(run, split, config.eval.batch_size, predict)
        if algorithm == "mst_kruskal":
            result = diagnostics.edge_mask_errors(
                arrays["predicted"],
                arrays["targets"],
                adjacency=arrays["inputs"],
                weights=arrays["input_A"],
            )
        else:
            weighted = algorithm in SHORTEST_PATHS
            result = diagnostics.pointer_errors(
                arrays["predicted"],
                arrays["targets"],
                adjacency=arrays["inputs"],
                weights=arrays["input_A"] if weighted else None,
            )
        if algorithm == "mst_prim":
            result["lightest_neighbour_score"] = run.task.lightest_neighbour_score(split)
        report[split] = result
        emit(format_split(split, result))
    return report


def format_edge_split(split: str, result: dict) -> str:
    """One split's edge-mask breakdown (`edge_mask_errors`) as a few lines of text."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
    return "\n".join(
        [
            f"{split}: F1 {100 * result['score']:.1f} (true / false positives "
            f"{result['true_positives']} / {result['false_positives']}, false negatives "
            f"{result['false_negatives']}, ordered pairs)",
            f"  tree edges kept: {pct(result['tree_kept'])} of {result['tree_edges']}; "
            f"non-tree edges dropped: {pct(result['non_tree_dropped'])} of "
            f"{result['non_tree_edges']} (a triangle's heaviest: "
            f"{pct(result['triangle_dropped'])} of {result['triangle_edges']}; the others: "
            f"{pct(result['cycle_dropped'])} of {result['cycle_edges']}); non-edges kept: "
            f"{result['non_edges_kept']}",
            f"  rules: keep every edge {100 * result['all_edges_score']:.1f}, drop each "
            f"triangle's heaviest {100 * result['triangle_rule_score']:.1f}",
        ]
    )


def format_split(split: str, result: dict) -> str:
    """One split's breakdown as a few lines of text."""
    if "tree_kept" in result:
        return format_edge_split(split, result)
    lines = [
        f"{split}: score {100 * result['accuracy']:.1f} ({result['errors']} wrong of "
        f"{result['nodes']}); wrong parents: {100 * result['reversed_share']:.0f}% reverse a "
        f"tree edge, {100 * result.get('non_neighbour_share', 0):.0f}% are no neighbour"
    ]
    if "lightest_neighbour_score" in result:
        lines.append(f"  lightest-neighbour rule: {100 * result['lightest_neighbour_score']:.1f}")
    if result.get("excess_median") is not None:
        lines.append(
            f"  path through the wrong parent longer by: median {result['excess_median']:.4f}; "
            f"{100 * result['excess_below_0.01']:.0f}% below 0.01, "
            f"{100 * result['excess_below_0.05']:.0f}% below 0.05"
        )
    if "near_tie_share_0.01" in result:
        accuracy = result["near_tie_accuracy_0.01"]
        lines.append(
            f"  near-ties (another parent within 0.01): {100 * result['near_tie_share_0.01']:.1f}%"
            " of nodes, scored " + ("-" if accuracy is None else f"{100 * accuracy:.1f}")
        )
    for key, name, title in (
        ("by_depth", "depths", "depth in the true tree"),
        ("by_degree", "degrees", "neighbours"),
    ):
        cells = [
            f"{b[name]}: {100 * b['share']:.0f}% of nodes, "
            + ("-" if b["accuracy"] is None else f"{100 * b['accuracy']:.1f}")
            for b in result.get(key, [])
            if b["nodes"]
        ]
        if cells:
            lines.append(f"  accuracy by {title}: " + "; ".join(cells))
    return "\n".join(lines)


def write_figure(report: dict[str, dict], path: str) -> str:
    """The breakdown's figure; returns ``path``.

    Pointer outputs: accuracy against depth in the true tree, one line per split (depth
    bins holding fewer than `MIN_NODES_PLOTTED` nodes of a split are left out). Edge
    masks (Kruskal): the kept and dropped shares per split (`_edge_bars`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    if "tree_kept" in next(iter(report.values())):
        _edge_bars(ax, report)
    else:
        _depth_lines(ax, report)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _depth_lines(ax: Any, report: dict[str, dict]) -> None:
    """Pointers: accuracy against depth in the true tree, one line per split."""
    labels = [b["depths"] for b in next(iter(report.values()))["by_depth"]]
    for split, result in report.items():
        bins = enumerate(result["by_depth"])
        points = [(i, 100 * b["accuracy"]) for i, b in bins if b["nodes"] >= MIN_NODES_PLOTTED]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=f"{split} (score {100 * result['accuracy']:.1f})")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(
        f"depth in the true tree (hops to the root; bins of >= {MIN_NODES_PLOTTED} nodes)"
    )
    ax.set_ylabel("right parents (%)")
    ax.legend(fontsize=8)


def _edge_bars(ax: Any, report: dict[str, dict]) -> None:
    """Kruskal: per split, the share of tree edges kept and of non-tree edges dropped."""
    kinds = (
        ("tree_kept", "tree edges kept"),
        ("triangle_dropped", "triangle-heaviest edges dropped"),
        ("cycle_dropped", "other non-tree edges dropped"),
    )
    width = 0.8 / len(kinds)
    for k, (key, label) in enumerate(kinds):
        values = [100 * (r[key] or 0.0) for r in report.values()]
        ax.bar(np.arange(len(report)) + (k - 1) * width, values, width, label=label)
    ax.set_xticks(
        range(len(report)), [f"{s} (F1 {100 * r['score']:.1f})" for s, r in report.items()]
    )
    ax.set_ylabel("share (%)")
    ax.set_ylim(0, 120)  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=3, loc="upper center")


def main(argv: Sequence[str]) -> None:
    launch_flags.run_split_tool(argv, diagnose_run, write_figure, OUTPUT)


if __name__ == "__main__":
    launch_flags.run(main)
