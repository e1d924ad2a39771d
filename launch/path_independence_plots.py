"""The PNG figures of the path-independence report (`launch.path_independence_report`).

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (Figures 2b, 4 and 5b).
"""

from __future__ import annotations

import os
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


def _save(fig: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
