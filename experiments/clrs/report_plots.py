"""The PNG of the CLRS report (`experiments.clrs.report`): score and steps against graph size.

One line per run: the colour is the algorithm, the line style the mode. Left: the CLRS
score (percent) at each evaluated graph size, the goal of the DEQ column at 64 nodes as
a cross per algorithm and, for the MSTs, the reference rule's score at each size as a
thin dotted line (`REFERENCE_RULES`). Right: the mean processor steps
at each size.

References:
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The MSTs' reference rules, the score of each (per split, in the report's JSON) under its
# key: what the model must beat (`ClrsTask.all_edges_score`, `lightest_neighbour_score`).
REFERENCE_RULES = {
    "all_edges_score": "predicting every edge",
    "lightest_neighbour_score": "pointing every node at its lightest neighbour",
}
STYLES = {"deq": "-", "hint_propagation": "--", "fixed_steps": ":"}


def _reference_points(rows: Sequence[dict], algorithm: str) -> list[tuple[int, float]]:
    """(nodes, percent) of the algorithm's reference rule, from its first row that has it."""
    for row in rows:
        if row["algorithm"] != algorithm:
            continue
        for key in REFERENCE_RULES:
            splits = row.get("splits", {}).values()
            points = [(s["nodes"], 100 * s[key]) for s in splits if key in s]
            if points:
                return sorted(points)
    return []


def write_figure(rows: Sequence[dict], path: str) -> str:
    """Draws the two panels for the report's rows; returns ``path``."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.2))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(algorithms)}
    for row in rows:
        if "splits" not in row:
            continue  # a diverged run
        points = sorted(row["splits"].values(), key=lambda s: s["nodes"])
        nodes = [p["nodes"] for p in points]
        style = dict(
            color=colours[row["algorithm"]],
            linestyle=STYLES.get(row["mode"], "-"),
            marker="o",
            label=f"{row['algorithm']} {row['mode']}",
        )
        left.plot(nodes, [100 * p["score"] for p in points], **style)
        right.plot(nodes, [p["nstep_mean"] for p in points], **style)
        if all("answer_mean" in p for p in points):  # replayed: when the answer settled
            label = f"{style['label']} answer"
            answer = dict(style, linestyle=(0, (1, 2)), marker="x", label=label)
            right.plot(nodes, [p["answer_mean"] for p in points], **answer)
    references = {}
    for algorithm in algorithms:
        goal = next(r["goal"] for r in rows if r["algorithm"] == algorithm)
        left.scatter([64], [goal], marker="x", s=60, color=colours[algorithm])
        reference = references[algorithm] = _reference_points(rows, algorithm)
        if reference:
            nodes, scores = zip(*reference, strict=True)
            label = f"{algorithm} reference rule"
            dotted = dict(color=colours[algorithm], linestyle=(0, (1, 3)), linewidth=1)
            left.plot(nodes, scores, label=label, **dotted)
    left.set_ylabel("score (%)  [x: DEQ column of the post at 64 nodes]")
    right.set_ylabel("processor steps (mean; dotted x: answer settled)")
    sizes = sorted({s["nodes"] for r in rows for s in r.get("splits", {}).values()})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("nodes per graph")
    if right.get_legend_handles_labels()[0]:  # a report of diverged runs only has none
        right.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if any(references.values()):
        left.legend(fontsize=6, handles=[h for h in left.lines if "reference" in h.get_label()])
    trained = {r["splits"]["val"]["nodes"] for r in rows if "val" in r.get("splits", {})}
    fig.suptitle(f"CLRS: trained on {', '.join(map(str, sorted(trained)))} nodes")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
