"""The PNG figures of the path-independence report (`experiments.path_independence.report`).

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (Figures 2b, 4 and 5b; the study's Figures 3 and 4).
"""

from __future__ import annotations

import os
from statistics import NormalDist
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAIN_VARIANTS = ("path_independent", "path_dependent")


def _metric(row: dict[str, Any]) -> str:
    """The whole-answer accuracy key of a test-time row (the first ``*accuracy`` key)."""
    for key in ("string_accuracy", "maze_accuracy", "accuracy"):
        if key in row:
            return key
    return "mse"


def plot_test_time(report: dict[str, Any], path: str) -> str:
    """Accuracy against the test-time budget, one panel per task, one line per split."""
    tasks = list(report["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for variant, style in zip(MAIN_VARIANTS, ("-", "--"), strict=True):
            curve = report["tasks"][task].get(variant, {}).get("test_time", [])
            for split in dict.fromkeys(r["split"] for r in curve):
                rows = [r for r in curve if r["split"] == split]
                key = _metric(rows[0])
                ax.plot(
                    [r["max_iter"] for r in rows],
                    [r[key] for r in rows],
                    style,
                    marker="o",
                    label=f"{variant.replace('_', '-')} {split}",
                )
                ax.set_ylabel(key)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("test-time iterations")
        ax.set_title(task)
        ax.legend(fontsize=6)
    return _save(fig, path)


def plot_aa_vs_accuracy(report: dict[str, Any], path: str) -> str:
    """AA against accuracy across every run, with the Spearman coefficient."""
    fig, ax = plt.subplots(figsize=(4.8, 3.8))
    for run in report["runs"]:
        marker = "o" if run["variant"] in MAIN_VARIANTS else "s"
        ax.scatter(run["aa"], run["accuracy"], marker=marker)
        ax.annotate(f"{run['task']}/{run['variant']}", (run["aa"], run["accuracy"]), fontsize=6)
    ax.set_xlabel("AA score")
    ax.set_ylabel("accuracy on the harder split")
    ax.set_title(f"Spearman {report['spearman']:.3f} over {len(report['runs'])} runs")
    return _save(fig, path)


def plot_aa_by_correctness(report: dict[str, Any], path: str) -> str:
    """Histograms of per-instance AA for correct and incorrect predictions."""
    panels = [
        (task, variant, section[variant]["table"]["split"])
        for task, section in report["tasks"].items()
        for variant in MAIN_VARIANTS
        if variant in section
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (task, variant, split) in zip(axes[0], panels, strict=True):
        aa = report["tasks"][task][variant]["aa"][split]
        right = [a for a, c in zip(aa["per_instance"], aa["correct"], strict=True) if c]
        wrong = [a for a, c in zip(aa["per_instance"], aa["correct"], strict=True) if not c]
        bins = [i / 20 for i in range(-20, 21)]
        ax.hist(right, bins=bins, alpha=0.6, label=f"correct ({len(right)})")
        ax.hist(wrong, bins=bins, alpha=0.6, label=f"incorrect ({len(wrong)})")
        ax.set_title(f"{task} {variant} {split}", fontsize=8)
        ax.set_xlabel("per-instance AA")
        ax.legend(fontsize=6)
    return _save(fig, path)


def write_figures(report: dict[str, Any], workdir: str) -> list[str]:
    """Writes every figure into ``workdir``; returns their paths."""
    join = lambda name: os.path.join(workdir, name)
    return [
        plot_test_time(report, join("test_time.png")),
        plot_aa_vs_accuracy(report, join("aa_vs_accuracy.png")),
        plot_aa_by_correctness(report, join("aa_by_correctness.png")),
    ]


# Accuracies are clipped to [PROBIT_EPS, 1 - PROBIT_EPS] before the probit transform.
PROBIT_EPS = 1e-3


def probit(accuracy: float) -> float:
    """The standard normal quantile of ``accuracy`` (clipped), the y scale of Figure 4."""
    return NormalDist().inv_cdf(min(max(accuracy, PROBIT_EPS), 1 - PROBIT_EPS))


def _probit_axis(ax: Any) -> None:
    ticks = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
    ax.set_yticks([probit(t) for t in ticks], [str(t) for t in ticks])


def plot_study_probit(rows: list[dict], summary: dict, path: str) -> str:
    """Figure 4: accuracy at the largest budget (probit scale) against AA, per task; runs
    that did not fit are hollow (left out of the Spearman coefficient)."""
    tasks = list(summary)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    colours = {"unrolled": "tab:red", "implicit": "tab:blue"}
    for ax, task in zip(axes[0], tasks, strict=True):
        for r in (r for r in rows if r["task"] == task and r.get("aa") is not None):
            colour = colours[r["gradient"]]
            ax.scatter(
                r["aa"],
                probit(r["accuracy"]),
                marker="^" if r["intervention"] else "o",
                facecolors=colour if r["fit"] else "none",
                edgecolors=colour,
            )
            ax.annotate(r["name"], (r["aa"], probit(r["accuracy"])), fontsize=5)
        _probit_axis(ax)
        s = summary[task]
        ax.set_title(
            f"{task}: Spearman {s['spearman']:.3f} over {s['fit']} fitted runs", fontsize=9
        )
        ax.set_xlabel("AA score (filled: fit; red: unroll + backprop, blue: implicit)")
        ax.set_ylabel("accuracy on harder inputs, largest budget")
    return _save(fig, path)


def plot_interventions(summary: dict, path: str) -> str:
    """Figure 3: each intervention as an arrow from its base run to the intervened run
    in the (AA, accuracy) plane, per task."""
    tasks = [t for t in summary if summary[t]["interventions"]] or list(summary)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for e in summary[task]["interventions"]:
            (a0, a1), (c0, c1) = e["aa"], [probit(v) for v in e["accuracy"]]
            ax.annotate("", (a1, c1), (a0, c0), arrowprops=dict(arrowstyle="->"))
            ax.scatter([a0, a1], [c0, c1], c=["grey", "tab:green"], s=12)
            ax.annotate(f"{e['base']} +{e['intervention']}", (a1, c1), fontsize=5)
        _probit_axis(ax)
        ax.set_title(f"{task}: interventions (grey: before, green: after)", fontsize=9)
        ax.set_xlabel("AA score")
        ax.set_ylabel("accuracy on harder inputs, largest budget")
    return _save(fig, path)


def write_study_figures(rows: list[dict], summary: dict, workdir: str) -> list[str]:
    """The study's two figures in ``workdir``; returns their paths."""
    return [
        plot_study_probit(rows, summary, os.path.join(workdir, "study_probit.png")),
        plot_interventions(summary, os.path.join(workdir, "study_interventions.png")),
    ]


def _save(fig: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
